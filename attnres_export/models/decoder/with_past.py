"""``DecoderLMWithPast``: the KV-cache step of a ``DecoderLM`` (docs/decode.md#decoderlm-with-past).

``forward(input_ids, attention_mask, position_ids, past) -> (logits, *presents)`` with ``past`` and the presents
in ``cache_inputs()`` order, two tensors per layer:

- grouped-query attention: ``past_key_values.{i}.key`` / ``.value`` ``[batch, num_key_value_heads, past,
  head_dim]``, keys after rotary (and after Qwen3's k-norm), never expanded to the query heads;
- latent attention (DeepSeek-V3): ``past_key_values.{i}.latent`` ``[batch, past, kv_lora_rank]``, the compressed
  latent after ``kv_a_layernorm``, and ``past_key_values.{i}.rope_key`` ``[batch, past, qk_rope_head_dim]``, the
  shared rotary key after rotary: what vLLM and SGLang cache, ``kv_lora_rank + qk_rope_head_dim`` numbers per token
  and layer instead of ``num_attention_heads * (qk_head_dim + v_head_dim)`` for expanded keys and values.

Attention Residuals keep no state across steps: blocks and partial sums live inside one forward pass.
"""

from __future__ import annotations

from attnres_export.models.base import CacheInput, WithPastStep


class DecoderLMWithPast(WithPastStep):
    """The with-past form of a ``DecoderLM`` (shares its weights)."""

    def cache_inputs(self) -> list[CacheInput]:
        cfg = self.config
        if cfg.mla is not None:
            per_layer = [("latent", cfg.mla.kv_lora_rank), ("rope_key", cfg.mla.qk_rope_head_dim)]
            return [CacheInput(f"past_key_values.{i}.{name}", ("batch", "past", size))
                    for i in range(cfg.num_hidden_layers) for name, size in per_layer]
        axes = ("batch", cfg.num_key_value_heads, "past", cfg.head_dim)
        return [CacheInput(f"past_key_values.{i}.{kv}", axes)
                for i in range(cfg.num_hidden_layers) for kv in ("key", "value")]

    def metadata(self) -> dict:
        """The body and its cache layout: ``attention`` is ``"grouped-query"`` (keys and values per layer) or
        ``"latent"`` (latent and rotary key per layer), with the sizes of one cached position."""
        cfg = self.config
        common = {"model_type": cfg.model_type, "num_hidden_layers": cfg.num_hidden_layers}
        if cfg.mla is not None:
            return common | {"attention": "latent", "kv_lora_rank": cfg.mla.kv_lora_rank,
                             "qk_rope_head_dim": cfg.mla.qk_rope_head_dim}
        return common | {"attention": "grouped-query", "num_attention_heads": cfg.num_attention_heads,
                         "num_key_value_heads": cfg.num_key_value_heads,
                         "head_dim": cfg.head_dim}
