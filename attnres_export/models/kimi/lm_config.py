"""``KimiLinearConfig``: a whole Kimi Linear body (docs/models.md#kimi-linear), read from a ``config.json`` with
transformers 5.23's ``KimiLinearConfig`` semantics (its ``attribute_map`` spellings, its defaults), every key
either read, inert, or refused in one line naming it.

The checkpoint form (``to_dict``) is the ``config.json`` itself under ``hf_config``: the body is fully determined
by it, so ``from_dict`` parses it again instead of keeping a second spelling of the same settings (the other fields
are what ``from_hf`` derives from it, never set afterwards).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from attnres_export.errors import CheckpointError
from attnres_export.models.config import Config
from attnres_export.models.kimi.config import RANGES, KdaConfig
from attnres_export.models.layers.hf_keys import IRRELEVANT_KEYS
from attnres_export.models.layers.moe import MoEConfig
from attnres_export.models.limits import few, is_whole, layer_count_refusal, shown

ARCH = "kimi-linear"
MODEL_TYPE = "kimi_linear"

ALIASES = {"moe_renormalize": "norm_topk_prob", "num_expert_group": "n_group", "num_experts": "num_local_experts",
           "num_experts_per_token": "num_experts_per_tok", "num_shared_experts": "n_shared_experts",
           "model_max_length": "max_position_embeddings"}
"""transformers' ``attribute_map``: the spelling ``save_pretrained`` writes -> the attribute it reads."""

DEFAULTS: dict[str, Any] = {
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": None, "n_shared_experts": 1,
    "routed_scaling_factor": 2.446, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 1048576, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "attention_bias": False, "num_local_experts": 256, "mlp_layer_types": None,
    "first_k_dense_replace": 1, "attn_res_block_size": None,
    "activation_situ_beta": None, "activation_situ_linear_beta": None, "routed_expert_hidden_size": None,
    "latent_moe_use_norm": False, "mla_use_output_gate": False,
}
"""``KimiLinearConfig``'s defaults (5.23) for the keys this body reads, and those of Kimi K3's additions (absent
means off, as in SGLang's ``kimi_k3.py``; a SiTU ``beta`` that is absent or null is 1.0 there)."""

ACTIVATIONS = ("silu", "situ")
"""``hidden_act`` of the feed-forwards: SwiGLU, or Kimi K3's SiTU (``models/kimi/mlp.py``)."""

KDA_KEYS = frozenset({"linear_attn_config", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim",
                      "layer_types"})
DERIVED = ("head_dim", "qk_head_dim")
"""Keys ``KimiLinearConfig.from_hf`` overwrites on load with ``qk_rope_head_dim`` and ``qk_nope + qk_rope``,
whatever config.json stores (Moonshot's published Kimi-Linear-48B-A3B config stores ``head_dim`` 72, its hidden size
over its heads): read as transformers reads them, so no stored value changes what is computed."""
INERT_VALUES = {"mla_use_nope": True, "moe_router_activation_func": "sigmoid", "use_grouped_topk": True,
                "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "topk_method": "noaux_tc"}
"""Keys of Moonshot's own config.json that transformers ignores, accepted only with the value that means what
transformers computes."""


@dataclass(frozen=True)
class KimiLinearConfig(Config):
    """The Kimi Linear body of one ``config.json`` (``hf_config``); the other fields are derived from it by
    ``from_hf``, the one way a config is made (its checkpoint form is ``hf_config`` alone)."""

    hf_config: dict[str, Any]
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    attention_bias: bool
    tie_word_embeddings: bool
    """Read and kept, but it ties nothing: transformers 5.23's ``KimiLinearForCausalLM`` has no tied weights."""
    kda: KdaConfig
    moe: MoEConfig
    mlp_layer_types: tuple[str, ...]
    attn_res_block_size: int | None
    hidden_act: str
    """``silu`` or Kimi K3's ``situ``, in every feed-forward (dense, shared and routed experts)."""
    situ_beta: float
    situ_linear_beta: float | None
    routed_expert_hidden_size: int | None
    """K3's latent MoE: the routed experts run at this width between ``routed_expert_down_proj`` and
    ``routed_expert_up_proj`` (the router and the shared experts stay at ``hidden_size``)."""
    latent_moe_use_norm: bool
    mla_use_output_gate: bool
    arch: str = ARCH

    KIND: ClassVar[str] = ARCH

    def problems(self) -> Iterator[str]:
        if self.arch != ARCH:
            yield f"arch must be {ARCH!r}, got {self.arch!r}"

    @property
    def layer_types(self) -> tuple[str, ...]:
        return self.kda.layer_types

    @property
    def max_seq_len(self) -> int:
        return self.max_position_embeddings

    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def attn_res(self) -> bool:
        return self.attn_res_block_size is not None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, index: int) -> bool:
        return self.mlp_layer_types[index] == "sparse"

    def describe(self) -> str:
        kda = sum(kind == "linear_attention" for kind in self.layer_types)
        residual = f"AttnRes, {self.attn_res_block_size} layers a block" if self.attn_res else "standard residuals"
        return (f"kimi_linear body, {self.num_hidden_layers} layers ({kda} KDA, {self.num_hidden_layers - kda} "
                f"MLA), {residual}")

    def features(self) -> list[tuple[str, str]]:
        """What this body computes, for ``attnres inspect``: (feature, setting) rows."""
        kda, moe = self.kda, self.moe
        sparse = [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]
        return [
            ("family", MODEL_TYPE), ("layers", str(self.num_hidden_layers)),
            ("KDA layers", f"{list(kda.kda_layers)} ({kda.num_heads} heads of {kda.head_dim}, conv {kda.conv_size})"),
            ("full-attention layers", str([i for i, kind in enumerate(self.layer_types) if kind == "full_attention"])),
            ("KDA gates", f"output gate {'full-rank g_proj' if kda.full_rank_gate else 'low-rank g_a/g_b'}, forget "
                          "gate " + ("softplus" if kda.gate_lower_bound is None
                                     else f"lower bound {kda.gate_lower_bound}")),
            ("latent attention", f"NoPE, {self.num_attention_heads} heads, q_lora_rank {self.q_lora_rank}, "
                                 f"kv_lora_rank {self.kv_lora_rank}, nope/shared/v head dims "
                                 f"{self.qk_nope_head_dim}/{self.qk_rope_head_dim}/{self.v_head_dim}"
                                 f"{', sigmoid output gate' if self.mla_use_output_gate else ''}"),
            ("experts", f"{moe.num_experts} routed, top-{moe.num_experts_per_tok}, {moe.n_shared_experts} shared "
                        f"(sigmoid router, {moe.topk_group} of {moe.n_group} groups) in layers {sparse}"),
            ("latent MoE", "off" if self.routed_expert_hidden_size is None else
             f"routed experts at width {self.routed_expert_hidden_size}"
             f"{' with RMSNorm' if self.latent_moe_use_norm else ''}"),
            ("activation", "SwiGLU (silu)" if self.hidden_act == "silu" else
             f"SiTU (beta {self.situ_beta}, linear_beta {self.situ_linear_beta})"),
            ("residual", self._residual_row()),
        ]

    def _residual_row(self) -> str:
        """The AttnRes blocks as ranges of decoder layers (the last one may be partial)."""
        if not self.attn_res:
            return "standard"
        size, layers = self.attn_res_block_size, self.num_hidden_layers
        blocks = [f"{start}-{min(start + size, layers) - 1}" for start in range(0, layers, size)]
        partial = ", the last partial" if layers % size else ""
        return f"Kimi K3 AttnRes, {size} decoder layers a block: {' '.join(blocks)}{partial}"

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint form: the ``config.json`` itself (``from_dict`` parses it again)."""
        return {"arch": self.arch, "hf_config": dict(self.hf_config)}

    @classmethod
    def from_dict(cls, raw: Any, what: str = "checkpoint config") -> KimiLinearConfig:
        if not isinstance(raw, dict) or set(raw) != {"arch", "hf_config"} or not isinstance(raw["hf_config"], dict):
            raise CheckpointError("kimi-linear checkpoint config must be {'arch': 'kimi-linear', 'hf_config': {...}}")
        return cls(hf_config=dict(raw["hf_config"]), **_parse(raw["hf_config"]), arch=raw["arch"])

    @classmethod
    def from_hf(cls, raw: Any, where: str = "config.json", layers_in_weights: set[int] | None = None
                ) -> KimiLinearConfig:
        """The config of a ``config.json``; a ``num_hidden_layers`` above the layers its folder's tensors hold
        (``layers_in_weights``) is refused before anything is sized by it (fewer is left to the loader, which names
        the tensors past the last layer)."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: expected a JSON object")
        declared = DEFAULTS["num_hidden_layers"] if raw.get("num_hidden_layers") is None else raw["num_hidden_layers"]
        if layers_in_weights is not None and is_whole(declared) and declared > len(layers_in_weights):
            raise layer_count_refusal(declared, layers_in_weights, where, "num_hidden_layers")
        try:
            return cls(hf_config=dict(raw), **_parse(raw))
        except CheckpointError as err:
            raise CheckpointError(f"{where}: {err}") from None


def _parse(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The derived fields of ``raw`` (a kimi_linear ``config.json``)."""
    if raw.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise CheckpointError(f"model_type {shown(raw.get('model_type'))} is not {MODEL_TYPE!r}")
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in raw.items():
        name = ALIASES.get(key, key)
        if name in values and values[name] != value:
            raise CheckpointError(f"{spelled[name]} and {key} are both given and disagree; keep one")
        values[name], spelled[name] = value, key
    for key, wanted in INERT_VALUES.items():
        if key in values and values.pop(key) != wanted:
            raise CheckpointError(f"{key} = {shown(raw[key])} is not implemented (only {wanted!r}, what transformers "
                                  "5.23 computes)")
    unknown = sorted(set(values) - set(DEFAULTS) - KDA_KEYS - set(DERIVED) - IRRELEVANT_KEYS, key=str)
    if unknown:
        raise CheckpointError(f"config key{'s' if len(unknown) > 1 else ''} {few(unknown)} not implemented "
                              "for kimi_linear (docs/models.md#kimi-linear lists what is computed)")

    def get(key: str) -> Any:
        return values[key] if values.get(key) is not None else DEFAULTS[key]

    def ranged(key: str) -> Any:
        """The value of ``key`` (or its default) when it is in its ``RANGES`` range."""
        value = get(key)
        problem = RANGES[key].expected(value)
        if problem:
            raise CheckpointError(f"{spelled.get(key, key)}: {problem}")
        return value

    def flag(key: str) -> bool:
        value = get(key)
        if not isinstance(value, bool):
            raise CheckpointError(f"{spelled.get(key, key)} must be true or false, got {shown(value)}")
        return value

    layers, heads = ranged("num_hidden_layers"), ranged("num_attention_heads")
    kv_heads = values.get("num_key_value_heads")
    if kv_heads is not None and kv_heads != heads:
        raise CheckpointError(f"num_key_value_heads {shown(kv_heads)} != num_attention_heads {heads}: Kimi Linear's "
                              "latent attention expands its keys to every head")
    if get("hidden_act") not in ACTIVATIONS:
        raise CheckpointError(f"hidden_act {shown(get('hidden_act'))} is not implemented (gated MLPs with "
                              f"{' or '.join(ACTIVATIONS)})")
    out = {key: ranged(key) for key in ("vocab_size", "hidden_size", "intermediate_size", "max_position_embeddings",
                                        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    out |= {"num_hidden_layers": layers, "num_attention_heads": heads, "attention_bias": flag("attention_bias"),
            "tie_word_embeddings": flag("tie_word_embeddings"), "rms_norm_eps": float(ranged("rms_norm_eps"))}
    out["q_lora_rank"] = None if get("q_lora_rank") is None else ranged("q_lora_rank")
    out["kda"] = KdaConfig.from_hf({**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}})
    out["mlp_layer_types"] = _mlp_layer_types(values.get("mlp_layer_types"), ranged("first_k_dense_replace"), layers)
    out["moe"] = MoEConfig(
        num_experts=ranged("num_local_experts"), num_experts_per_tok=ranged("num_experts_per_tok"),
        moe_intermediate_size=ranged("moe_intermediate_size"), norm_topk_prob=flag("norm_topk_prob"),
        scoring_func="sigmoid", topk_method="noaux_tc", n_shared_experts=ranged("n_shared_experts"),
        routed_scaling_factor=float(ranged("routed_scaling_factor")), n_group=ranged("n_group"),
        topk_group=ranged("topk_group"))
    out["attn_res_block_size"] = None if get("attn_res_block_size") is None else ranged("attn_res_block_size")
    out.update(_k3_additions(values, get, ranged, flag))
    return out


def _k3_additions(values: Mapping[str, Any], get, ranged, flag) -> dict[str, Any]:
    """Kimi K3's SiTU, latent MoE and MLA output gate (SGLang ``kimi_k3.py``; docs/models.md#kimi-k3)."""

    def clip(key: str, default: float | None) -> float | None:
        return default if values.get(key) is None else float(ranged(key))

    latent = None if get("routed_expert_hidden_size") is None else ranged("routed_expert_hidden_size")
    if flag("latent_moe_use_norm") and latent is None:
        raise CheckpointError("latent_moe_use_norm is true but routed_expert_hidden_size is null; the norm is of "
                              "the latent MoE")
    return {"hidden_act": get("hidden_act"), "situ_beta": clip("activation_situ_beta", 1.0),
            "situ_linear_beta": clip("activation_situ_linear_beta", None),
            "routed_expert_hidden_size": latent, "latent_moe_use_norm": flag("latent_moe_use_norm"),
            "mla_use_output_gate": flag("mla_use_output_gate")}


def _mlp_layer_types(given: Any, first_dense: int, layers: int) -> tuple[str, ...]:
    """``mlp_layer_types`` as given, else transformers' default (the first ``first_k_dense_replace`` dense)."""
    if given is None:
        return tuple("dense" if i < first_dense else "sparse" for i in range(layers))
    if not isinstance(given, list) or len(given) != layers or any(kind not in ("dense", "sparse") for kind in given):
        raise CheckpointError(f"mlp_layer_types must list {layers} values of dense, sparse")
    return tuple(given)
