"""``DecoderConfig``: the hyper-parameters of a decoder LM body (docs/models.md#decoderlm), in plain values.

The config is built from a Hugging Face ``config.json`` by ``hf_config.parse_hf_config`` (which reads
transformers' spellings and defaults) or from our own plain-values dict (``from_dict``, the checkpoint format).
Everything the model computes is a field here; the per-layer choice of dense or mixture-of-experts
feed-forward is ``moe_layers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from attnres_export.models.config import Config
from attnres_export.models.layers.moe import MoEConfig
from attnres_export.models.limits import (
    EPS,
    EXPERT_COUNT,
    EXPERTS,
    FLOAT32_MAX,
    HEAD_DIM,
    HEADS,
    LAYER_COUNT,
    LAYERS,
    MAX_MULTIPLIER,
    MAX_POSITIONS,
    MULTIPLIER,
    POSITIONS,
    VOCAB,
    WIDTH,
    Range,
    is_whole,
    shown,
)

ARCH = "decoder-lm"
FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")
"""Hugging Face ``model_type`` values whose bodies ``DecoderLM`` computes."""
ROPE_TYPES = ("default", "linear", "llama3", "yarn")

RANGES: dict[str, Range] = {
    "vocab_size": VOCAB, "hidden_size": WIDTH, "intermediate_size": WIDTH, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": HEAD_DIM,
    "max_position_embeddings": POSITIONS, "rms_norm_eps": EPS, "attn_res_block_size": LAYERS,
    "max_window_layers": LAYER_COUNT,
    "rope_theta": Range(1, FLOAT32_MAX, whole=False, open_low=True),
    "factor": Range(1, MAX_POSITIONS, whole=False),
    "original_max_position_embeddings": POSITIONS,
    "low_freq_factor": Range(0, MAX_POSITIONS, whole=False, open_low=True),
    "high_freq_factor": Range(0, MAX_POSITIONS, whole=False, open_low=True),
    "attention_factor": MULTIPLIER,
    "beta_fast": Range(0, MAX_POSITIONS, whole=False), "beta_slow": Range(0, MAX_POSITIONS, whole=False),
    "mscale": Range(0, MAX_MULTIPLIER, whole=False), "mscale_all_dim": Range(0, MAX_MULTIPLIER, whole=False),
    "q_lora_rank": WIDTH, "kv_lora_rank": WIDTH, "qk_nope_head_dim": HEAD_DIM, "qk_rope_head_dim": HEAD_DIM,
    "v_head_dim": HEAD_DIM,
    "num_experts": EXPERT_COUNT, "num_local_experts": EXPERT_COUNT, "n_routed_experts": EXPERT_COUNT,
    "num_experts_per_tok": EXPERTS, "moe_intermediate_size": WIDTH, "n_shared_experts": EXPERT_COUNT,
    "routed_scaling_factor": MULTIPLIER, "n_group": EXPERTS, "topk_group": EXPERTS, "decoder_sparse_step": LAYERS,
    "first_k_dense_replace": LAYER_COUNT, "num_nextn_predict_layers": LAYER_COUNT, "num_mtp_layers": LAYER_COUNT,
    "mtp_layers": LAYER_COUNT,
}
"""Every number of a decoder config, by its config.json key (and the field that holds it), with its accepted values
(``models/limits.py``): read through this table by ``hf_config.py`` and checked again by the dataclasses below, so
a checkpoint of ours is held to the same ranges. Rotary: a base above 1 (the frequencies ``theta^(-2i/d)`` fall,
and yarn divides by ``ln(theta)``) within float32, where they are computed; context factors from 1 up to the
longest context; positive frequency factors (llama3 divides by them); yarn's rotations ``beta_*`` and ``mscale*``
not negative (``0.1 * mscale * ln(factor) + 1`` divides and must stay >= 1)."""


def out_of_range(config: Any) -> Iterator[str]:
    """The fields of ``config`` (a dataclass) out of their ``RANGES``; None is "not set"."""
    for item in fields(config):
        value, accepted = getattr(config, item.name), RANGES.get(item.name)
        if accepted is not None and value is not None and not accepted.holds(value):
            yield f"{item.name}: {accepted.expected(value)}"


@dataclass(frozen=True)
class RopeConfig(Config):
    """Rotary embedding settings, with transformers' meaning of each field (``rope_parameters``)."""

    rope_type: str = "default"
    rope_theta: float = 10000.0
    factor: float | None = None
    """``linear``/``llama3``/``yarn``: the context-extension factor."""
    original_max_position_embeddings: int | None = None
    """``llama3``/``yarn``: the pre-training context length."""
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    """``yarn``: scale of cos/sin; None = derived from ``factor``, ``mscale`` and ``mscale_all_dim``."""
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    KIND: ClassVar[str] = "decoder"
    DEFAULTED_OPTIONAL: ClassVar[bool] = True

    def problems(self) -> Iterator[str]:
        return out_of_range(self)


@dataclass(frozen=True)
class LatentAttentionConfig(Config):
    """DeepSeek-V3 multi-head latent attention sizes."""

    q_lora_rank: int | None
    """None: queries are one projection ``q_proj``; else ``q_a_proj`` -> RMSNorm -> ``q_b_proj``."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True
    """Rotary dims laid out in interleaved pairs (DeepSeek's checkpoints) rather than two halves."""

    KIND: ClassVar[str] = "decoder"
    DEFAULTED_OPTIONAL: ClassVar[bool] = True

    def problems(self) -> Iterator[str]:
        return out_of_range(self)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class DecoderConfig(Config):
    """A decoder LM body of one of ``FAMILIES`` (docs/models.md#decoderlm)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    """Per-head RMSNorm of queries and keys before rotary (Qwen3)."""
    tie_word_embeddings: bool = False
    mla: LatentAttentionConfig | None = None
    moe: MoEConfig | None = None
    """transformers' MoE keys (``layers/moe.py``), for the layers in ``moe_layers``."""
    moe_layers: tuple[int, ...] = ()
    """Indices of the layers whose feed-forward is a mixture of experts (the rest are dense)."""
    mtp_layers: int = 0
    """DeepSeek multi-token-prediction layers stored after the body (``model.layers.{N}..``); not computed."""
    attn_res_block_size: int | None = None
    """Attention Residuals with K3's conventions: decoder layers per block; None = standard residuals."""
    arch: str = ARCH

    KIND: ClassVar[str] = "decoder"
    DEFAULTED_OPTIONAL: ClassVar[bool] = True

    def problems(self) -> Iterator[str]:
        if self.arch != ARCH:
            yield f"arch must be {ARCH!r}, got {self.arch!r}"
        if self.model_type not in FAMILIES:
            yield f"model_type must be one of {', '.join(FAMILIES)}, got {self.model_type!r}"
        yield from out_of_range(self)
        if is_whole(self.num_key_value_heads) and is_whole(self.num_attention_heads) and self.num_key_value_heads >= 1 \
                and self.num_attention_heads % self.num_key_value_heads:
            yield (f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
                   f"{self.num_key_value_heads}")
        if self.mla is None and is_whole(self.head_dim) and self.head_dim % 2:
            yield f"head_dim {self.head_dim} must be even for rotary embeddings"
        if self.mla is not None and self.mla.qk_rope_head_dim % 2:
            yield f"qk_rope_head_dim {self.mla.qk_rope_head_dim} must be even for rotary embeddings"
        if self.rope.rope_type not in ROPE_TYPES:
            yield f"rope_type must be one of {', '.join(ROPE_TYPES)}, got {self.rope.rope_type!r}"
        if is_whole(self.num_hidden_layers) and (
                len(self.moe_layers) > self.num_hidden_layers
                or any(not is_whole(i) or not 0 <= i < self.num_hidden_layers for i in self.moe_layers)):
            yield (f"moe_layers must list at most {self.num_hidden_layers} layers of 0..{self.num_hidden_layers - 1}, "
                   f"got {shown(list(self.moe_layers))}")
        if self.moe_layers and self.moe is None:
            yield "moe_layers are given without MoE settings"

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the model is meant for (``max_position_embeddings``)."""
        return self.max_position_embeddings

    @property
    def n_layers(self) -> int:
        """Decoder layers (the checkpoint loader counts them against the weights before building)."""
        return self.num_hidden_layers

    @property
    def attn_res(self) -> bool:
        return self.attn_res_block_size is not None

    def is_moe_layer(self, index: int) -> bool:
        return index in self.moe_layers

    def describe(self) -> str:
        residual = f"AttnRes, {self.attn_res_block_size} layers a block" if self.attn_res else "standard residuals"
        return f"{self.model_type} body, {self.num_hidden_layers} layers, {residual}"

    def features(self) -> list[tuple[str, str]]:
        """What this body computes, for ``attnres inspect``: (feature, setting) rows."""
        rows = [("family", self.model_type), ("layers", str(self.num_hidden_layers))]
        if self.mla is not None:
            m = self.mla
            rows.append(("attention", f"multi-head latent (heads {self.num_attention_heads}, q_lora_rank "
                                      f"{m.q_lora_rank}, kv_lora_rank {m.kv_lora_rank}, nope/rope/v head dims "
                                      f"{m.qk_nope_head_dim}/{m.qk_rope_head_dim}/{m.v_head_dim})"))
        else:
            kind = "multi-head" if self.num_key_value_heads == self.num_attention_heads else "grouped-query"
            rows.append(("attention", f"{kind} ({self.num_attention_heads} heads, {self.num_key_value_heads} KV "
                                      f"heads, head_dim {self.head_dim})"))
        scaling = "" if self.rope.rope_type == "default" else f", factor {self.rope.factor}"
        rows.append(("rope", f"{self.rope.rope_type}, theta {self.rope.rope_theta:g}{scaling}"))
        extras = [name for name, on in (("qkv bias", self.qkv_bias), ("o_proj bias", self.o_proj_bias),
                                        ("mlp bias", self.mlp_bias), ("qk-norm", self.qk_norm),
                                        ("tied embeddings", self.tie_word_embeddings)) if on]
        rows.append(("extras", ", ".join(extras) or "none"))
        if self.moe is not None:
            e = self.moe
            shared = f", {e.n_shared_experts} shared" if e.n_shared_experts else ""
            rows.append(("experts", f"{e.num_experts} routed, top-{e.num_experts_per_tok}{shared} "
                                    f"({e.scoring_func} router) in layers {list(self.moe_layers)}"))
        rows.append(("residual", f"Kimi K3 AttnRes, {self.attn_res_block_size} decoder layers a block"
                                 if self.attn_res else "standard"))
        return rows
