"""Hugging Face ``config.json`` keys every family reading those folders accepts whatever their value."""

from __future__ import annotations

IRRELEVANT_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "auto_map",
    "initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id", "problem_type",
    "chunk_size_feed_forward", "is_encoder_decoder", "tokenizer_class", "pretraining_tp",
    "output_router_logits", "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "ep_size", "quantization_config",
})
"""Keys accepted whatever their value: token ids, training-only settings (dropout, auxiliary losses, init),
parallelism hints, bookkeeping. ``pretraining_tp`` only sliced the matmuls of older Llama code.
``quantization_config`` is the weight store's (``models.store.quantized``), not the family config's."""
