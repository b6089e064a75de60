"""The Kimi Delta Attention settings of a Kimi Linear ``config.json``, read as transformers 5.23's
``KimiLinearConfig`` reads them (docs/models.md#kimi-delta-attention), with every key this package does not
compute refused in one line naming it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attnres_export.errors import CheckpointError

CONV_ACTIVATIONS = ("silu", "swish")
"""``hidden_act`` values the short convolutions apply (transformers' ACT2FN: both are x * sigmoid(x))."""

LINEAR_ATTN_KEYS = {"head_dim", "num_heads", "short_conv_kernel_size", "kda_layers", "full_attn_layers",
                    "use_full_rank_gate", "gate_lower_bound"}
"""Keys of ``linear_attn_config`` read: transformers 5.23's, and Kimi K3's full-rank output gate and forget-gate
lower bound (docs/models.md#kimi-k3)."""

SITU = "situ"
"""Kimi K3's ``hidden_act``: it names the feed-forwards' activation; K3's short convolutions stay SiLU (SGLang's
``KimiK3DeltaAttention`` hands its convolution weights to the KDA kernel, whose convolution is SiLU)."""

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

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "head_dim", "conv_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CheckpointError(f"Kimi config: {name} must be an int >= 1, got {value!r}")
        if not (isinstance(self.norm_eps, float | int) and math.isfinite(self.norm_eps) and self.norm_eps >= 0):
            raise CheckpointError(f"Kimi config: rms_norm_eps must be a finite number >= 0, got {self.norm_eps!r}")
        if self.activation not in CONV_ACTIVATIONS:
            raise CheckpointError(f"Kimi config: hidden_act {self.activation!r} is not implemented for the short "
                                  f"convolutions (only {', '.join(CONV_ACTIVATIONS)})")
        if not isinstance(self.full_rank_gate, bool):
            raise CheckpointError(f"Kimi config: linear_attn_config.use_full_rank_gate must be true or false, got "
                                  f"{self.full_rank_gate!r}")
        bound = self.gate_lower_bound
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | float)
                                  or not math.isfinite(bound) or bound >= 0):
            raise CheckpointError(f"Kimi config: linear_attn_config.gate_lower_bound must be a finite number < 0 "
                                  f"(a log-decay bound) or null, got {bound!r}")

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
                raise CheckpointError(f"Kimi config: linear_attn_config.{key} = {value!r} is not implemented "
                                      "(docs/models.md#kimi-linear lists what is computed)")

        def flat(key: str) -> Any:
            return config.get(key, DEFAULTS[key])

        layers = flat("num_hidden_layers")
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
    kinds = {"linear_attention", "full_attention"}
    if not isinstance(given, list) or len(given) != layers or not set(given) <= kinds:
        raise CheckpointError(f"Kimi config: layer_types must list {layers} values of {', '.join(sorted(kinds))}")
    if listed is not None and tuple(given) != listed:
        raise CheckpointError("Kimi config: layer_types disagrees with linear_attn_config.kda_layers/full_attn_layers;"
                              " remove one of them")
    return tuple(given)


def _from_lists(kda: Any, full: Any, layers: int) -> tuple[str, ...]:
    """Layer kinds from the 1-based lists; every layer must be in exactly one."""
    for name, values in (("kda_layers", kda), ("full_attn_layers", full)):
        if not isinstance(values, list) or not all(isinstance(v, int) and 1 <= v <= layers for v in values):
            raise CheckpointError(f"Kimi config: linear_attn_config.{name} must list layer numbers 1..{layers} "
                                  f"(1-based), got {values!r}")
    both = sorted(set(kda) & set(full))
    missing = sorted(set(range(1, layers + 1)) - set(kda) - set(full))
    if both or missing or len(kda) + len(full) != layers:
        raise CheckpointError(f"Kimi config: every layer 1..{layers} must be in exactly one of kda_layers and "
                              f"full_attn_layers (in both: {both}, in neither: {missing})")
    return tuple("linear_attention" if i + 1 in kda else "full_attention" for i in range(layers))
