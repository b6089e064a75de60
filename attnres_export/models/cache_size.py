"""What a with-past graph's cache costs, read from a model's ``cache_inputs()`` (docs/decode.md#cache-bytes).

A state with a ``past`` axis grows by one position per token (grouped keys and values, a latent and its rope
key); one without keeps its size whatever the length (Kimi Delta Attention's recurrent and conv states), so it is
counted per sequence. ``python -m attnres_export.models.cache_size`` prints the table of docs/decode.md for the
published configs below, built through each family's own reader (no weights: the model is built on the meta
device).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.base import PAST_PREFIX, CacheInput

LAYER = re.compile(re.escape(PAST_PREFIX) + r"(\d+)\.")


@dataclass(frozen=True)
class CacheBytes:
    """Per layer index, the bytes one cached position takes (``per_token``) and the bytes held per sequence
    whatever its length (``per_sequence``); a layer appears only where it holds such a state."""

    per_token: dict[int, int]
    per_sequence: dict[int, int]

    def token_total(self) -> int:
        return sum(self.per_token.values())

    def sequence_total(self) -> int:
        return sum(self.per_sequence.values())


def cache_bytes(cache: Sequence[CacheInput], dtype: str) -> CacheBytes:
    """The bytes of ``cache`` for one sequence (batch 1) in the export storage type ``dtype``; a state of a fixed
    type (``float32`` recurrent states) counts in its own type."""
    per_token: dict[int, int] = {}
    per_sequence: dict[int, int] = {}
    for entry in cache:
        match = LAYER.match(entry.name)
        if match is None:
            raise CheckpointError(f"cache input {entry.name!r} is not named {PAST_PREFIX}LAYER.NAME")
        held = dtype if entry.dtype == "model" else entry.dtype
        size = torch.empty((), dtype=getattr(torch, held)).element_size()
        size *= math.prod(a for a in entry.axes if isinstance(a, int))
        target = per_token if "past" in entry.axes else per_sequence
        layer = int(match.group(1))
        target[layer] = target.get(layer, 0) + size
    return CacheBytes(per_token, per_sequence)


def hf_config_cache(config: dict, where: str) -> list[CacheInput]:
    """The ``cache_inputs()`` of the model a Hugging Face ``config.json`` describes, through its family's reader
    (the registry's ``hf_model_types``), built without weights."""
    from attnres_export.models.registry import build_model, for_hf_model_type

    family = for_hf_model_type(str(config.get("model_type")))
    if family is None:
        raise CheckpointError(f"{where}: model_type {config.get('model_type')!r} is not a family attnres reads")
    with torch.device("meta"):
        model = build_model(family.read_hf_config(config, where))
    with_past = model.with_past()
    if with_past is None:
        raise CheckpointError(f"{where}: {family.name} models have no with-past graph")
    return with_past.cache_inputs()


KDA_LAYERS = [i for i in range(1, 28) if i % 4 and i != 27]
PUBLISHED: dict[str, dict] = {
    "Llama-3-8B": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "tie_word_embeddings": False},
    "Qwen3-8B": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "hidden_act": "silu",
        "tie_word_embeddings": False, "attention_bias": False},
    "Qwen3-30B-A3B": {
        "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False},
    "DeepSeek-V3": {
        "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
        "moe_layer_freq": 1, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False},
    "Kimi-Linear-48B-A3B": {
        "model_type": "kimi_linear", "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
        "moe_intermediate_size": 1024, "num_hidden_layers": 27, "num_attention_heads": 32,
        "num_key_value_heads": 32, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "linear_attn_config": {
            "kda_layers": KDA_LAYERS, "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "num_heads": 32,
            "head_dim": 128, "short_conv_kernel_size": 4},
        "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_renormalize": True,
        "routed_scaling_factor": 2.446, "first_k_dense_replace": 1, "num_expert_group": 1, "topk_group": 1,
        "model_max_length": 1048576, "rms_norm_eps": 1e-5, "tie_word_embeddings": False},
}
"""The published config.json values that size each model (the keys the readers take; the rest of each file is
training and tooling settings). Left out: Kimi Linear's ``head_dim: 72`` (``hidden_size / heads``), which the
reader refuses against the 64 transformers derives (``qk_rope_head_dim``); no cache size depends on it."""


def _layout(cache: Sequence[CacheInput], layer: int) -> str:
    """``key [8, past, 128] + value [8, past, 128]``: what one layer caches, batch axis left out."""
    return " + ".join(f"{c.name.split('.')[-1]} [{', '.join(map(str, c.axes[1:]))}]" for c in cache
                      if LAYER.match(c.name).group(1) == str(layer))


def _spread(values: dict[int, int]) -> str:
    return " / ".join(f"{v:,}" for v in sorted(set(values.values()))) or "-"


def table(dtypes: Sequence[str] = ("float32", "float16")) -> str:
    """The markdown table of docs/decode.md#cache-bytes: per published config, what each kind of layer caches, its
    bytes per token (a growing state) or per sequence (a fixed one), and the whole model's, in each of ``dtypes``
    (batch 1)."""
    spelled = "/".join(d.removeprefix("float") for d in dtypes)
    head = ["model", "layers", "each layer caches", f"bytes per token per layer (float{spelled})",
            f"bytes per sequence per layer (float{spelled})", f"per token, all layers (float{spelled})",
            f"per sequence, all layers (float{spelled})"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, config in PUBLISHED.items():
        cache = hf_config_cache(config, name)
        sizes = [cache_bytes(cache, d) for d in dtypes]
        layers = sorted({int(LAYER.match(c.name).group(1)) for c in cache})
        layouts: dict[str, int] = {}
        for layer in layers:
            layouts[_layout(cache, layer)] = layouts.get(_layout(cache, layer), 0) + 1
        kinds = "; ".join(f"{count} x {layout}" if len(layouts) > 1 else layout for layout, count in layouts.items())
        rows.append("| " + " | ".join([
            name, str(len(layers)), kinds, " ; ".join(_spread(s.per_token) for s in sizes),
            " ; ".join(_spread(s.per_sequence) for s in sizes), " ; ".join(f"{s.token_total():,}" for s in sizes),
            " ; ".join(f"{s.sequence_total():,}" for s in sizes)]) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
