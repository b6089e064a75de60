"""The architecture registry: one entry per model family (docs/architecture.md#adding-an-architecture).

An entry names its model and config classes by import path, so that reading the registry (the CLI validates
``--arch`` before torch is imported) costs nothing; ``build``/``config_type`` import the family's module on use.
Nothing outside ``models/`` names a concrete model class: it asks the registry, the model contract
(``models/base.py``) or an entry's capabilities.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from attnres_export.errors import CheckpointError
from attnres_export.models.limits import check_depth


@dataclass(frozen=True)
class Capabilities:
    """What an architecture's models can do, read by the exporter, decoding and the CLI before any model exists."""

    with_past: bool = False
    """Has a with-past (KV-cache or state) graph: ``--with-past``, ``generate``."""
    fuse_norm: bool = False
    """Its aggregations feed RMSNorms that ``--fuse-norm`` can merge into AttnResAggregateNorm nodes."""
    ops: tuple[str, ...] = ()
    """The attnres op types its exports may hold."""
    generates_text: bool = False
    """A causal LM whose logits pick the next token."""


@dataclass(frozen=True)
class Architecture:
    name: str
    """The ``arch`` of a checkpoint config and of ``attnres example --arch``."""
    summary: str
    model: str
    """``module:Class`` of the model (imported on use)."""
    config: str
    """``module:Class`` of its config: a frozen dataclass with ``arch``, ``vocab_size``, ``max_seq_len``,
    ``from_dict``, ``to_dict`` and ``describe`` (``models/config.py:FamilyConfig`` gives them)."""
    capabilities: Capabilities
    hf_model_types: tuple[str, ...] = ()
    """Hugging Face ``model_type`` values whose folders this family reads (docs/models.md#checkpoint-folders)."""
    hf_architecture: str = ""
    """The ``architectures`` entry written into a folder of ours."""
    hf_reader: str = ""
    """``module:function`` turning a Hugging Face folder's ``(config.json dict, tensors, where)`` into ``(family
    config, state_dict)`` for the weight store: the tensors are ``models.store.StoredTensor`` (renamed, stacked,
    narrowed without reading); needed when ``hf_model_types`` is not empty."""
    hf_config: str = ""
    """``module:callable`` turning a Hugging Face ``(config.json dict, where)`` into the family config, without
    weights (cache sizes of a published config: ``models/cache_size.py``); needed with ``hf_reader``."""
    example_folder: str = ""
    """``module:function`` writing a tiny random folder of one of ``hf_model_types`` (``attnres example``)."""
    aliases: tuple[str, ...] = field(default=())

    def config_type(self) -> type:
        return _resolve(self.config)

    def model_type(self) -> type:
        return _resolve(self.model)

    def read_hf(self, config: dict, tensors: dict, where: str) -> tuple[Any, dict]:
        return _resolve(self.hf_reader)(config, tensors, where)

    def read_hf_config(self, config: dict, where: str) -> Any:
        return _resolve(self.hf_config)(config, where)

    def write_example_folder(self, hf_type: str, out_dir: Any, seed: int, block_size: int | None,
                             layers: int | None) -> tuple[Any, dict, int]:
        """``(folder, config, parameter count)`` of a tiny random ``hf_type`` folder."""
        return _resolve(self.example_folder)(hf_type, out_dir, seed, block_size, layers)

    def build(self, cfg: Any) -> Any:
        """A model of ``cfg`` with default-initialised weights (under ``torch.device("meta")``: none allocated)."""
        return self.model_type()(cfg)


ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture(
            name="attnres-lm", summary="decoder LM with AttnRes (Full/Block) or standard residuals",
            model="attnres_export.models.attnres_lm:AttnResLM",
            config="attnres_export.models.attnres_lm:AttnResLMConfig",
            capabilities=Capabilities(with_past=True, fuse_norm=True, ops=("AttnResAggregate", "AttnResAggregateNorm"),
                                      generates_text=True),
            hf_architecture="AttnResLM",
        ),
        Architecture(
            name="realformer", summary="BERT-style encoder with residual attention scores",
            model="attnres_export.models.realformer.model:RealFormer",
            config="attnres_export.models.realformer.model:RealFormerConfig",
            capabilities=Capabilities(ops=("ResidualScoreAttention",)),
            hf_architecture="RealFormer",
        ),
        Architecture(
            name="decoder-lm", summary="the decoder bodies people deploy (Llama, Qwen2, Qwen3, Qwen3-MoE, "
                                      "DeepSeek-V3), with or without Kimi K3's Attention Residuals",
            model="attnres_export.models.decoder.model:DecoderLM",
            config="attnres_export.models.decoder.config:DecoderConfig",
            capabilities=Capabilities(with_past=True, fuse_norm=True, ops=("AttnResAggregate", "AttnResAggregateNorm"),
                                      generates_text=True),
            hf_model_types=("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3"),
            hf_reader="attnres_export.models.decoder.folder:read_hf",
            hf_config="attnres_export.models.decoder.hf_config:parse_hf_config",
            example_folder="attnres_export.models.decoder.example:write_example_folder",
        ),
        Architecture(
            name="kimi-linear", summary="Kimi Linear (Kimi Delta Attention and NoPE latent attention, dense and MoE "
                                        "feed-forwards), with or without Kimi K3's Attention Residuals",
            model="attnres_export.models.kimi.model:KimiLinearLM",
            config="attnres_export.models.kimi.lm_config:KimiLinearConfig",
            capabilities=Capabilities(with_past=True, fuse_norm=True, ops=("AttnResAggregate", "AttnResAggregateNorm",
                                                                           "KimiDeltaAttention"),
                                      generates_text=True),
            hf_model_types=("kimi_linear", "kimi_k3"),
            hf_architecture="KimiLinearForCausalLM",
            hf_reader="attnres_export.models.kimi.folder:read_hf",
            hf_config="attnres_export.models.kimi.lm_config:KimiLinearConfig.from_hf",
            example_folder="attnres_export.models.kimi.example:write_example_folder",
        ),
    )
}


def _resolve(target: str) -> Any:
    module, _, name = target.partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def architecture(name: str) -> Architecture:
    """The registry entry of ``name``; an unknown one is refused in one line listing the known ones."""
    for arch in ARCHITECTURES.values():
        if name == arch.name or name in arch.aliases:
            return arch
    raise CheckpointError(f"arch {name!r} is not a known architecture; known: {', '.join(ARCHITECTURES)}")


def architecture_of(model: Any) -> Architecture:
    """The entry a built model belongs to (by its config's ``arch``)."""
    return architecture(model.config.arch)


def for_hf_model_type(model_type: str) -> Architecture | None:
    return next((a for a in ARCHITECTURES.values() if model_type in a.hf_model_types), None)


def hf_model_types() -> list[str]:
    """Every Hugging Face ``model_type`` some family reads."""
    return [t for a in ARCHITECTURES.values() for t in a.hf_model_types]


def for_example(name: str) -> tuple[Architecture, str | None]:
    """``attnres example --arch NAME``: an architecture, or a Hugging Face family (``llama``...) and its entry."""
    family = for_hf_model_type(name.replace("-", "_"))
    if family is not None and family.example_folder:
        return family, name.replace("-", "_")
    return architecture(name), None


def config_from_dict(raw: Any) -> Any:
    """The family config of a checkpoint's plain-values ``config`` (its ``arch`` picks the family)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"checkpoint 'config' must be a dict of plain values, got {type(raw).__name__}")
    check_depth(raw, "checkpoint config")
    return architecture(str(raw.get("arch", "attnres-lm"))).config_type().from_dict(raw)


def build_model(cfg: Any) -> Any:
    """The model of ``cfg``'s architecture."""
    return architecture(cfg.arch).build(cfg)
