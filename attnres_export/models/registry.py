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
    module: str
    """Import path of the family's module, which defines the classes below."""
    model_class: str
    config_class: str
    capabilities: Capabilities
    hf_model_types: tuple[str, ...] = ()
    """Hugging Face ``model_type`` values whose folders this family reads (docs/models.md#checkpoint-folders)."""
    hf_architecture: str = ""
    """The ``architectures`` entry written into a folder of ours."""
    aliases: tuple[str, ...] = field(default=())

    def _module(self) -> Any:
        return importlib.import_module(self.module)

    def config_type(self) -> type:
        return getattr(self._module(), self.config_class)

    def model_type(self) -> type:
        return getattr(self._module(), self.model_class)

    def build(self, cfg: Any) -> Any:
        """A model of ``cfg`` with default-initialised weights (under ``torch.device("meta")``: none allocated)."""
        return self.model_type()(cfg)


ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture(
            name="attnres-lm", summary="decoder LM with AttnRes (Full/Block) or standard residuals",
            module="attnres_export.models.attnres_lm", model_class="AttnResLM", config_class="AttnResLMConfig",
            capabilities=Capabilities(with_past=True, fuse_norm=True, ops=("AttnResAggregate", "AttnResAggregateNorm"),
                                      generates_text=True),
            hf_architecture="AttnResLM",
        ),
        Architecture(
            name="realformer", summary="BERT-style encoder with residual attention scores",
            module="attnres_export.models.realformer", model_class="RealFormer", config_class="RealFormerConfig",
            capabilities=Capabilities(ops=("ResidualScoreAttention",)),
            hf_architecture="RealFormer",
        ),
    )
}


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


def config_from_dict(raw: Any) -> Any:
    """The family config of a checkpoint's plain-values ``config`` (its ``arch`` picks the family)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"checkpoint 'config' must be a dict of plain values, got {type(raw).__name__}")
    return architecture(str(raw.get("arch", "attnres-lm"))).config_type().from_dict(raw)


def build_model(cfg: Any) -> Any:
    """The model of ``cfg``'s architecture."""
    return architecture(cfg.arch).build(cfg)
