"""The Kimi Delta Attention settings of a Kimi Linear ``config.json``, read as transformers 5.23's
``KimiLinearConfig`` reads them (docs/models.md#kimi-delta-attention), with every key this package does not
compute refused in one line naming it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from attnres_export.errors import CheckpointError
from attnres_export.models.limits import (
    EPS,
    EXPERTS,
    HEAD_DIM,
    HEADS,
    LAYER_COUNT,
    LAYERS,
    MAX_CONV,
    MAX_MULTIPLIER,
    MULTIPLIER,
    POSITIONS,
    VOCAB,
    WIDTH,
    Range,
    is_whole,
    shown,
)

CONV_ACTIVATIONS = ("silu", "swish")
"""``hidden_act`` values the short convolutions apply (transformers' ACT2FN: both are x * sigmoid(x))."""

LINEAR_ATTN_KEYS = {"head_dim", "num_heads", "short_conv_kernel_size", "kda_layers", "full_attn_layers",
                    "use_full_rank_gate", "gate_lower_bound"}
"""Keys of ``linear_attn_config`` read: transformers 5.23's, and Kimi K3's full-rank output gate and forget-gate
lower bound (docs/models.md#kimi-k3)."""

SITU = "situ"
"""Kimi K3's ``hidden_act``: it names the feed-forwards' activation; K3's short convolutions stay SiLU (SGLang's
``KimiK3DeltaAttention`` hands its convolution weights to the KDA kernel, whose convolution is SiLU)."""

RANGES: dict[str, Range] = {
    "vocab_size": VOCAB, "hidden_size": WIDTH, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "intermediate_size": WIDTH, "max_position_embeddings": POSITIONS, "kv_lora_rank": WIDTH, "q_lora_rank": WIDTH,
    "qk_nope_head_dim": HEAD_DIM, "qk_rope_head_dim": HEAD_DIM, "v_head_dim": HEAD_DIM, "rms_norm_eps": EPS,
    "first_k_dense_replace": LAYER_COUNT, "moe_intermediate_size": WIDTH, "num_local_experts": EXPERTS,
    "num_experts_per_tok": EXPERTS, "n_shared_experts": EXPERTS, "n_group": EXPERTS, "topk_group": EXPERTS,
    "routed_scaling_factor": MULTIPLIER, "attn_res_block_size": LAYERS, "routed_expert_hidden_size": WIDTH,
    "activation_situ_beta": MULTIPLIER, "activation_situ_linear_beta": MULTIPLIER,
    "linear_attn_config.num_heads": HEADS, "linear_attn_config.head_dim": HEAD_DIM,
    "linear_attn_config.short_conv_kernel_size": Range(1, MAX_CONV),
    "linear_attn_config.gate_lower_bound": Range(-MAX_MULTIPLIER, 0, whole=False, open_high=True),
}
"""Every number of a Kimi Linear / K3 config.json (``linear_attn_config``'s by their dotted keys) with its accepted
values (``models/limits.py``), read through this table by ``KdaConfig`` and ``lm_config.py``: the SiTU clip levels
``beta`` are positive multipliers (``beta * tanh(x / beta)``), the forget-gate lower bound a negative log-decay."""

DEFAULTS = {"linear_head_dim": 128, "linear_num_heads": 32, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "num_hidden_layers": 27, "hidden_size": 2304}
"""``KimiLinearConfig``'s defaults for the keys a KDA layer reads."""


@dataclass(frozen=True)
class KdaConfig:
    """What one ``KimiLinearDeltaAttention`` layer needs; ``layer_types`` as transformers spells them."""

    hidden_size: int
    num_heads: int
    head_dim: int
    conv_size: int
    norm_eps: float
    layer_types: tuple[str, ...]
    activation: str = "silu"
    full_rank_gate: bool = False
    """K3's ``use_full_rank_gate``: the output gate is one ``g_proj`` [H*dk, D] instead of ``g_b_proj(g_a_proj)``."""
    gate_lower_bound: float | None = None
    """K3's ``gate_lower_bound``: the log-decay is ``lower_bound * sigmoid(exp(A_log) * (f + dt_bias))`` (the
    "safe gate" of transformers' ``Glm5NextTextForgetGate``) instead of ``-exp(A_log) * softplus(f + dt_bias)``."""

    FIELD_KEYS: ClassVar[dict[str, str]] = {
        "hidden_size": "hidden_size", "num_heads": "linear_attn_config.num_heads",
        "head_dim": "linear_attn_config.head_dim", "conv_size": "linear_attn_config.short_conv_kernel_size",
        "norm_eps": "rms_norm_eps", "gate_lower_bound": "linear_attn_config.gate_lower_bound"}
    """The ``RANGES`` key of each number (a null ``gate_lower_bound`` is the softplus gate)."""

    def __post_init__(self) -> None:
        for name, key in self.FIELD_KEYS.items():
            value = getattr(self, name)
            problem = None if value is None and name == "gate_lower_bound" else RANGES[key].expected(value)
            if problem:
                raise CheckpointError(f"Kimi config: {key}: {problem}")
        if self.activation not in CONV_ACTIVATIONS:
            raise CheckpointError(f"Kimi config: hidden_act {shown(self.activation)} is not implemented for the short "
                                  f"convolutions (only {', '.join(CONV_ACTIVATIONS)})")
        if not isinstance(self.full_rank_gate, bool):
            raise CheckpointError(f"Kimi config: linear_attn_config.use_full_rank_gate must be true or false, got "
                                  f"{shown(self.full_rank_gate)}")

    @property
    def kda_layers(self) -> tuple[int, ...]:
        """0-based indices of the KDA layers."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "linear_attention")

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> KdaConfig:
        """From a Kimi Linear ``config.json`` (a dict): ``linear_attn_config`` first, then the flat
        ``linear_*`` keys, then transformers' defaults."""
        linear = config.get("linear_attn_config") or {}
        if not isinstance(linear, Mapping):
            raise CheckpointError(f"Kimi config: linear_attn_config must be a dict, got {type(linear).__name__}")
        for key, value in linear.items():
            if key not in LINEAR_ATTN_KEYS:
                raise CheckpointError(f"Kimi config: linear_attn_config.{key} = {shown(value)} is not implemented "
                                      "(docs/models.md#kimi-linear lists what is computed)")

        def flat(key: str) -> Any:
            return config.get(key, DEFAULTS[key])

        layers = flat("num_hidden_layers")
        problem = RANGES["num_hidden_layers"].expected(layers)
        if problem:
            raise CheckpointError(f"Kimi config: num_hidden_layers: {problem}")
        return cls(
            hidden_size=flat("hidden_size"),
            num_heads=linear.get("num_heads", flat("linear_num_heads")),
            head_dim=linear.get("head_dim", flat("linear_head_dim")),
            conv_size=linear.get("short_conv_kernel_size", flat("linear_conv_kernel_dim")),
            norm_eps=flat("rms_norm_eps"),
            activation="silu" if flat("hidden_act") == SITU else flat("hidden_act"),
            layer_types=_layer_types(config.get("layer_types"), linear, layers),
            full_rank_gate=linear.get("use_full_rank_gate", False),
            gate_lower_bound=linear.get("gate_lower_bound"),
        )


def _layer_types(given: Any, linear: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    """``layer_types`` when the config has it, else from the 1-based ``kda_layers``/``full_attn_layers``, else
    transformers' default (every fourth layer, from index 4, full attention). Both given must agree."""
    listed = None
    if "kda_layers" in linear and "full_attn_layers" in linear:
        listed = _from_lists(linear["kda_layers"], linear["full_attn_layers"], layers)
    elif "kda_layers" in linear or "full_attn_layers" in linear:
        raise CheckpointError("Kimi config: linear_attn_config needs both kda_layers and full_attn_layers, or neither")
    if given is None:
        return listed or tuple("full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers))
    kinds = ("linear_attention", "full_attention")
    if not isinstance(given, list) or len(given) != layers or any(kind not in kinds for kind in given):
        raise CheckpointError(f"Kimi config: layer_types must list {layers} values of {', '.join(sorted(kinds))}")
    if listed is not None and tuple(given) != listed:
        raise CheckpointError("Kimi config: layer_types disagrees with linear_attn_config.kda_layers/full_attn_layers;"
                              " remove one of them")
    return tuple(given)


def _from_lists(kda: Any, full: Any, layers: int) -> tuple[str, ...]:
    """Layer kinds from the 1-based lists; every layer must be in exactly one. Each list is bounded by the layer
    count before it is read and held as a set, so a list of any length costs one pass."""
    for name, values in (("kda_layers", kda), ("full_attn_layers", full)):
        if not isinstance(values, list) or len(values) > layers or not all(is_whole(v) and 1 <= v <= layers
                                                                           for v in values):
            raise CheckpointError(f"Kimi config: linear_attn_config.{name} must list layer numbers 1..{layers} "
                                  f"(1-based), each of the {layers} layers at most once, got {shown(values)}")
    kda_set, full_set = set(kda), set(full)
    both = sorted(kda_set & full_set)
    missing = sorted(set(range(1, layers + 1)) - kda_set - full_set)
    if both or missing or len(kda) + len(full) != layers:
        raise CheckpointError(f"Kimi config: every layer 1..{layers} must be in exactly one of kda_layers and "
                              f"full_attn_layers (in both: {shown(both)}, in neither: {shown(missing)})")
    return tuple("linear_attention" if i + 1 in kda_set else "full_attention" for i in range(layers))
