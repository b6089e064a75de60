"""A Hugging Face ``config.json`` read with transformers' semantics into a ``DecoderConfig``.

transformers (5.x) fills a key a config.json leaves out from its config class's default, reads rotary settings
from ``rope_parameters`` (5.x) or from the older top-level ``rope_theta`` / ``rope_scaling`` (``rope_scaling``
wins when both are given, as ``convert_rope_params_to_dict`` does), and treats ``null`` as "not set". This
module does the same for the five families in ``FAMILIES``. Every key is either read (and its value checked),
listed in ``IRRELEVANT_KEYS`` (no effect on inference), or refused in one line naming it: an unimplemented
setting is never ignored.
"""

from __future__ import annotations

import math
from typing import Any

from attnres_export.errors import CheckpointError
from attnres_export.models.decoder.config import (
    FAMILIES,
    RANGES,
    ROPE_TYPES,
    DecoderConfig,
    LatentAttentionConfig,
    MoEConfig,
    RopeConfig,
)
from attnres_export.models.layers.hf_keys import IRRELEVANT_KEYS
from attnres_export.models.limits import few, is_whole, layer_count_refusal, shown

COMMON_KEYS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "rope_parameters", "rope_theta", "rope_scaling", "original_max_position_embeddings",
    "attn_res_block_size",
})
SLIDING_KEYS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
QWEN3_MOE_KEYS = frozenset({"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                            "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
DEEPSEEK_KEYS = frozenset({
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim",
    "rope_interleave", "n_routed_experts", "num_local_experts", "n_shared_experts", "num_experts_per_tok",
    "moe_intermediate_size", "routed_scaling_factor", "n_group", "topk_group", "first_k_dense_replace",
    "norm_topk_prob", "scoring_func", "topk_method", "moe_layer_freq", "num_nextn_predict_layers",
    "num_mtp_layers",
})
FAMILY_KEYS = {
    "llama": frozenset({"attention_bias", "mlp_bias"}),
    "qwen2": SLIDING_KEYS,
    "qwen3": SLIDING_KEYS | {"attention_bias"},
    "qwen3_moe": SLIDING_KEYS | QWEN3_MOE_KEYS | {"attention_bias"},
    "deepseek_v3": DEEPSEEK_KEYS | {"attention_bias"},
}
"""Keys each family's transformers config reads, beyond ``COMMON_KEYS``."""

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "num_key_value_heads": None, "head_dim": None},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": None},
    "qwen3": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128},
    "qwen3_moe": {"max_position_embeddings": 32768, "num_key_value_heads": 4, "head_dim": None,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
                  "num_experts": 128, "norm_topk_prob": False, "mlp_only_layers": []},
    "deepseek_v3": {"max_position_embeddings": 4096, "num_key_value_heads": 128, "q_lora_rank": 1536,
                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "rope_interleave": True, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "routed_scaling_factor": 2.5,
                    "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "norm_topk_prob": True,
                    "num_nextn_predict_layers": 1},
}
"""transformers' config-class defaults (5.23) for keys a config.json may leave out; every family also has
``hidden_act="silu"``, ``rms_norm_eps=1e-6``, ``tie_word_embeddings=False`` and the biases off."""
SHARED_DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                   "attention_bias": False, "mlp_bias": False}
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

ROPE_KEYS = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                       "mscale", "mscale_all_dim", "truncate"}),
}
"""The scaling fields each rope type reads (besides ``rope_type``/``type``, ``rope_theta`` and a
``partial_rotary_factor`` of 1)."""
UNSUPPORTED_ROPE = {"dynamic": "dynamic NTK scaling", "longrope": "LongRoPE", "proportional": "proportional RoPE"}


class _Reader:
    """Typed access to one config.json with the family's defaults; every failure is one line naming the key."""

    def __init__(self, raw: dict, family: str, where: str) -> None:
        self.raw, self.where = raw, where
        self.defaults = SHARED_DEFAULTS | FAMILY_DEFAULTS[family]

    def refuse(self, key: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: {key}: {why}")

    def value(self, key: str) -> Any:
        """The value given, or transformers' default when the key is left out (``null`` stays ``None``)."""
        return self.raw[key] if key in self.raw else self.defaults.get(key)

    def ranged(self, key: str, value: Any) -> Any:
        """``value`` when it is in the range ``RANGES`` gives its key (``rope_parameters.factor`` is ``factor``)."""
        problem = RANGES[key.rpartition(".")[2]].expected(value)
        if problem:
            raise self.refuse(key, problem)
        return value

    def integer(self, key: str, allow_none: bool = False) -> int | None:
        value = self.value(key)
        return None if value is None and allow_none else self.ranged(key, value)

    def number(self, key: str, value: Any = None) -> float:
        return float(self.ranged(key, self.value(key) if value is None else value))

    def flag(self, key: str) -> bool:
        value = self.value(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.refuse(key, f"expected true or false, got {shown(value)}")
        return value


def parse_hf_config(raw: Any, where: str = "config.json", layers_in_weights: set[int] | None = None) -> DecoderConfig:
    """The ``DecoderConfig`` of a Hugging Face ``config.json`` (already parsed JSON) of one of ``FAMILIES``;
    ``layers_in_weights``, the layer indices its folder's tensors hold, bounds the layer count first."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: expected a JSON object")
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(f"{where}: model_type {shown(family)} is not supported; decoder-lm reads "
                              f"{', '.join(FAMILIES)}")
    _refuse_unknown_keys(raw, family, where)
    missing = [key for key in REQUIRED if raw.get(key) is None]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)}")
    read = _Reader(raw, family, where)
    layers = _layer_count(read, layers_in_weights)
    _refuse_sliding_window(read, family, layers)
    if read.value("hidden_act") != "silu":
        raise read.refuse("hidden_act", f"{shown(read.value('hidden_act'))} is not supported (gated MLPs with silu "
                          "only)")
    heads = read.integer("num_attention_heads")
    hidden = read.integer("hidden_size")
    kv_heads = read.integer("num_key_value_heads", allow_none=True) or heads
    mla = _latent_attention(read) if family == "deepseek_v3" else None
    if mla is not None and kv_heads != heads:
        raise read.refuse("num_key_value_heads", f"{kv_heads} != num_attention_heads {heads}: latent attention "
                          "expands its keys to every head")
    head_dim = _head_dim(read, family, hidden, heads, mla)
    max_positions = read.integer("max_position_embeddings")
    moe, moe_layers = _moe(read, family, layers)
    attention_bias = read.flag("attention_bias")
    return DecoderConfig(
        model_type=family, vocab_size=read.integer("vocab_size"), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=read.integer("intermediate_size"), rms_norm_eps=read.number("rms_norm_eps"),
        max_position_embeddings=max_positions, rope=parse_rope(read, max_positions),
        qkv_bias=family == "qwen2" or attention_bias, o_proj_bias=family != "qwen2" and attention_bias,
        mlp_bias=read.flag("mlp_bias"), qk_norm=family in ("qwen3", "qwen3_moe"),
        tie_word_embeddings=read.flag("tie_word_embeddings"), mla=mla, moe=moe, moe_layers=moe_layers,
        mtp_layers=_mtp_layers(read) if family == "deepseek_v3" else 0,
        attn_res_block_size=read.integer("attn_res_block_size", allow_none=True),
    )


def _refuse_unknown_keys(raw: dict, family: str, where: str) -> None:
    if raw.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise CheckpointError(f"{where}: partial_rotary_factor {shown(raw['partial_rotary_factor'])}: partial rotary "
                              "embeddings are not supported")
    known = IRRELEVANT_KEYS | COMMON_KEYS | FAMILY_KEYS[family] | {"partial_rotary_factor"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise CheckpointError(f"{where}: config key{'s' if len(unknown) > 1 else ''} {few(unknown)} not implemented "
                              f"for {family} (decoder-lm computes what docs/models.md#decoderlm lists)")


def _layer_count(read: _Reader, held: set[int] | None) -> int:
    """``num_hidden_layers``, refused before anything is sized by it when it is more than the layers the weights
    hold (``held``), then checked against its range. Fewer is left to the loader, which names the tensors past the
    last layer (a DeepSeek folder may hold its multi-token-prediction layers there)."""
    declared = read.value("num_hidden_layers")
    if held is not None and is_whole(declared) and declared > len(held):
        raise layer_count_refusal(declared, held, read.where, "num_hidden_layers")
    return read.integer("num_hidden_layers")


def _refuse_sliding_window(read: _Reader, family: str, layers: int) -> None:
    """Sliding-window attention (Qwen ``use_sliding_window``, ``layer_types``) is refused; the window size and
    layer count that only matter with it are accepted, as transformers clears them when it is off."""
    if family not in ("qwen2", "qwen3", "qwen3_moe"):
        return
    if read.flag("use_sliding_window"):
        raise read.refuse("use_sliding_window", "sliding-window attention is not supported")
    if "max_window_layers" in read.raw and read.raw["max_window_layers"] is not None:
        read.integer("max_window_layers")
    types = read.raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or any(t != "full_attention" for t in types):
            raise read.refuse("layer_types", "only 'full_attention' layers are supported (no sliding-window layers)")
        if len(types) != layers:
            raise read.refuse("layer_types", f"{len(types)} entries for {layers} layers")


def _head_dim(read: _Reader, family: str, hidden: int, heads: int, mla: LatentAttentionConfig | None) -> int:
    """``head_dim`` as given, else transformers' default (``hidden_size // num_attention_heads``; Qwen3: 128).
    DeepSeek-V3's is derived (``qk_rope_head_dim``): a stored value must agree."""
    if mla is not None:
        given = read.raw.get("head_dim")
        if given is not None and given != mla.qk_rope_head_dim:
            raise read.refuse("head_dim", f"{shown(given)} differs from qk_rope_head_dim {mla.qk_rope_head_dim}, "
                              "which DeepSeek-V3 derives it from")
        return mla.qk_rope_head_dim
    return read.integer("head_dim", allow_none=True) or hidden // heads


def parse_rope(read: _Reader, max_positions: int) -> RopeConfig:
    """Rotary settings from ``rope_parameters`` or the older ``rope_theta``/``rope_scaling``; every field of the
    chosen ``rope_type`` resolved as transformers resolves it (``beta_fast``/``beta_slow`` 32/1 when unset or 0,
    ``truncate`` true, ``original_max_position_embeddings`` from the top-level key first, then the rope dict,
    then ``max_position_embeddings``; yarn's ``attention_factor`` from ``factor``, ``mscale``,
    ``mscale_all_dim``)."""
    scaling = read.raw.get("rope_scaling")
    source = "rope_scaling" if scaling else "rope_parameters"
    params = scaling or read.raw.get("rope_parameters") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise read.refuse(source, "expected one flat object of rope settings (per-layer-type rope is not supported)")
    params = dict(params)
    rope_type, legacy = params.pop("rope_type", None), params.pop("type", None)
    if rope_type is not None and legacy is not None and rope_type != legacy:
        raise read.refuse(source, f"rope_type {shown(rope_type)} and type {shown(legacy)} disagree")
    rope_type = rope_type or legacy or "default"
    if not isinstance(rope_type, str):
        raise read.refuse(f"{source}.rope_type", f"expected one of {', '.join(ROPE_TYPES)}, got {shown(rope_type)}")
    if rope_type in UNSUPPORTED_ROPE:
        raise read.refuse(f"{source}.rope_type", f"{shown(rope_type)} ({UNSUPPORTED_ROPE[rope_type]}) is not "
                          f"supported; supported: {', '.join(ROPE_TYPES)}")
    if rope_type not in ROPE_TYPES:
        raise read.refuse(f"{source}.rope_type", f"{shown(rope_type)} is not supported; supported: "
                          f"{', '.join(ROPE_TYPES)}")
    theta = params.pop("rope_theta", None)
    theta = read.number("rope_theta", theta if theta is not None else read.raw.get("rope_theta", 10000.0))
    if params.pop("partial_rotary_factor", None) not in (None, 1, 1.0):
        raise read.refuse(f"{source}.partial_rotary_factor", "partial rotary embeddings are not supported")
    unknown = sorted(set(params) - ROPE_KEYS[rope_type])
    if unknown:
        raise read.refuse(f"{source}.{unknown[0]}", f"not a setting of rope_type {shown(rope_type)} (reads: "
                          f"{', '.join(sorted(ROPE_KEYS[rope_type])) or 'none'})")
    top_original = read.raw.get("original_max_position_embeddings")
    if top_original is not None and rope_type not in ("llama3", "yarn"):
        raise read.refuse("original_max_position_embeddings", f"has no effect with rope_type {shown(rope_type)}")
    if rope_type == "default":
        return RopeConfig(rope_type=rope_type, rope_theta=theta)
    factor = _rope_number(read, source, params, "factor")
    if rope_type == "linear":
        return RopeConfig(rope_type=rope_type, rope_theta=theta, factor=factor)
    key = "original_max_position_embeddings"
    original = read.ranged(key, top_original) if top_original is not None else params.get(key)
    original = max_positions if original is None else read.ranged(f"{source}.{key}", original)
    if rope_type == "llama3":
        low = _rope_number(read, source, params, "low_freq_factor")
        high = _rope_number(read, source, params, "high_freq_factor")
        if high <= low:
            raise read.refuse(f"{source}.high_freq_factor", f"{high} must exceed low_freq_factor {low}")
        return RopeConfig(rope_type=rope_type, rope_theta=theta, factor=factor,
                          original_max_position_embeddings=original, low_freq_factor=low, high_freq_factor=high)
    return _yarn(read, source, params, theta, factor, original)


def _yarn(read: _Reader, source: str, params: dict, theta: float, factor: float, original: int) -> RopeConfig:
    optional = {k: (None if params.get(k) is None else read.number(f"{source}.{k}", params[k]))
                for k in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")}
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise read.refuse(f"{source}.truncate", f"expected true or false, got {shown(truncate)}")
    attention_factor = optional["attention_factor"]
    if attention_factor is None:
        mscale, mscale_all = optional["mscale"], optional["mscale_all_dim"]
        attention_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all
                            else yarn_mscale(factor))
    return RopeConfig(rope_type="yarn", rope_theta=theta, factor=factor, original_max_position_embeddings=original,
                      attention_factor=attention_factor, beta_fast=optional["beta_fast"] or 32.0,
                      beta_slow=optional["beta_slow"] or 1.0, mscale=optional["mscale"],
                      mscale_all_dim=optional["mscale_all_dim"], truncate=truncate)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 when the factor does not extend)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _rope_number(read: _Reader, source: str, params: dict, key: str) -> float:
    if params.get(key) is None:
        raise read.refuse(f"{source}.{key}", "required by this rope_type")
    return read.number(f"{source}.{key}", params[key])


def _latent_attention(read: _Reader) -> LatentAttentionConfig:
    nope, rope = read.integer("qk_nope_head_dim"), read.integer("qk_rope_head_dim")
    given = read.raw.get("qk_head_dim")
    if given is not None and given != nope + rope:
        raise read.refuse("qk_head_dim", f"{shown(given)} differs from qk_nope_head_dim + qk_rope_head_dim = "
                          f"{nope + rope}")
    return LatentAttentionConfig(
        q_lora_rank=read.integer("q_lora_rank", allow_none=True), kv_lora_rank=read.integer("kv_lora_rank"),
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=read.integer("v_head_dim"),
        rope_interleave=read.flag("rope_interleave"),
    )


def _moe(read: _Reader, family: str, layers: int) -> tuple[MoEConfig | None, tuple[int, ...]]:
    """The MoE settings and the layers they apply to, with each family's rule (transformers 5.23):
    ``qwen3_moe``: layer ``i`` is MoE unless ``i in mlp_only_layers``, when ``num_experts > 0`` and
    ``(i + 1) % decoder_sparse_step == 0``; ``deepseek_v3``: ``i >= first_k_dense_replace``."""
    if family == "qwen3_moe":
        experts_key = "num_local_experts" if "num_local_experts" in read.raw else "num_experts"
        experts = read.integer(experts_key)
        step = read.integer("decoder_sparse_step")
        dense = _layer_set(read, "mlp_only_layers", layers)
        moe_layers = tuple(i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0)
        keys = MoEConfig(num_experts=experts, num_experts_per_tok=read.integer("num_experts_per_tok"),
                       moe_intermediate_size=read.integer("moe_intermediate_size"),
                       norm_topk_prob=read.flag("norm_topk_prob"), scoring_func="softmax", topk_method="greedy")
        return (keys if moe_layers else None), moe_layers
    if family == "deepseek_v3":
        for key, expected in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("moe_layer_freq", 1)):
            if read.raw.get(key) not in (None, expected):
                raise read.refuse(key, f"{shown(read.raw[key])} is not supported (transformers' DeepSeek-V3 computes "
                                  f"{expected!r})")
        experts_key = "num_local_experts" if "num_local_experts" in read.raw else "n_routed_experts"
        experts = read.integer(experts_key)
        first_dense = read.integer("first_k_dense_replace")
        moe_layers = tuple(range(first_dense, layers)) if experts else ()
        keys = MoEConfig(num_experts=experts, num_experts_per_tok=read.integer("num_experts_per_tok"),
                       moe_intermediate_size=read.integer("moe_intermediate_size"),
                       norm_topk_prob=read.flag("norm_topk_prob"), scoring_func="sigmoid", topk_method="noaux_tc",
                       n_shared_experts=read.integer("n_shared_experts"),
                       routed_scaling_factor=read.number("routed_scaling_factor"),
                       n_group=read.integer("n_group"), topk_group=read.integer("topk_group"))
        return (keys if moe_layers else None), moe_layers
    return None, ()


def _layer_set(read: _Reader, key: str, layers: int) -> frozenset[int]:
    """A list of layer indices (``mlp_only_layers``) as a set, refused unless it lists at most ``layers`` indices
    of ``0 .. layers - 1``: membership is then one lookup, and an index naming no layer is a mistake."""
    given = read.value(key) or []
    if not isinstance(given, list) or len(given) > layers or any(not is_whole(i) or not 0 <= i < layers
                                                                 for i in given):
        raise read.refuse(key, f"expected a list of at most {layers} layer indices of 0..{layers - 1} ({layers} "
                          f"layers), got {shown(given)}")
    return frozenset(given)


def _mtp_layers(read: _Reader) -> int:
    """DeepSeek multi-token-prediction layers (``num_nextn_predict_layers``, alias ``num_mtp_layers``)."""
    key = "num_mtp_layers" if "num_mtp_layers" in read.raw else "num_nextn_predict_layers"
    return read.integer(key)
