"""The model contract: what the exporter, the with-past export, decoding, the checkpoint loader and
``attnres example`` need from a model (docs/architecture.md#the-model-contract).

Every architecture in ``models/registry.py`` builds an ``nn.Module`` that satisfies ``ExportableModel``; one that
has a KV cache (or any other state carried between decode steps) also returns a ``WithPastModel`` from
``with_past()``. Code outside ``models/`` talks to models through these two protocols and the registry's
capabilities, never through a concrete class.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

PAST_PREFIX = "past_key_values."
PRESENT_PREFIX = "present."
STEP_INPUTS = ("input_ids", "attention_mask", "position_ids")
"""The inputs of every with-past graph before its cache inputs (the names optimum and onnxruntime-genai use)."""


@dataclass(frozen=True)
class CacheInput:
    """One state tensor a with-past graph takes and returns: a layer's keys or values, a compressed latent, a
    recurrent state.

    ``axes`` names each axis: ``"batch"`` and ``"past"`` are dynamic (``past`` grows by the new tokens each step;
    a state without a ``past`` axis keeps its shape), an int is static. ``dtype`` is ``"model"`` (the export's
    storage type) or a fixed storage type such as ``"float32"`` (recurrent states are always float32)."""

    name: str
    axes: tuple[str | int, ...]
    dtype: str = "model"

    @property
    def present(self) -> str:
        """The output that carries this state after the step."""
        return PRESENT_PREFIX + self.name.removeprefix(PAST_PREFIX)

    def empty(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """The state before the first token: no past positions, zeros elsewhere."""
        held = dtype if self.dtype == "model" else getattr(torch, self.dtype)
        shape = [batch if a == "batch" else 0 if a == "past" else a for a in self.axes]
        return torch.zeros(shape, dtype=held)


@runtime_checkable
class ExportableModel(Protocol):
    """A model the exporter can trace and check: ``forward(**inputs) -> outputs`` in ``output_names`` order."""

    config: Any
    """The family's config; every config has ``arch``, ``vocab_size`` and ``max_seq_len``."""
    input_axes: Mapping[str, Mapping[int, str]]
    """Per graph input, its dynamic axes (``batch``, ``seq``)."""
    output_names: Sequence[str]

    def random_inputs(self, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Inputs of one check shape, keyed by ``input_axes``."""
        ...

    def aggregation_count(self) -> int:
        """Depth aggregations in one forward pass (0 for a standard residual stream)."""
        ...

    def fused_node_count(self) -> int:
        """attnres nodes an export of this model holds."""
        ...

    def score_weights_folded(self) -> AbstractContextManager[None]:
        """Inside, each aggregation's score weight is one float32 tensor (for export); restored afterwards."""
        ...

    def norms_fused(self) -> AbstractContextManager[None]:
        """Inside, each aggregation and the RMSNorm after it run as one ``attnres::aggregate_norm`` op."""
        ...

    def with_past(self) -> WithPastModel | None:
        """The KV-cache form of this model (shares its weights), or None when it has none."""
        ...


@runtime_checkable
class WithPastModel(Protocol):
    """One prefill or decode step: ``forward(input_ids, attention_mask, position_ids, past) -> (logits,
    *presents)``; ``past`` is a list of tensors in ``cache_inputs()`` order (docs/decode.md)."""

    config: Any

    def cache_inputs(self) -> list[CacheInput]:
        ...

    def metadata(self) -> dict:
        """What the export records about the cache (sizes per layer), for ``attnres build`` and ``generate``."""
        ...


class WithPastStep(nn.Module):
    """The with-past form of a model that has ``forward_with_past`` (it shares the model's weights): the step of
    ``WithPastModel``. A family's subclass adds ``cache_inputs`` and ``metadata``."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    @property
    def config(self) -> Any:
        return self.lm.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        logits, presents = self.lm.forward_with_past(input_ids, attention_mask, position_ids, past)
        return (logits, *presents)


@dataclass(frozen=True)
class PlanValue:
    """A tensor of an export plan: a graph input, or an input of a piece's signature.

    ``axes`` names each axis (``"batch"``, ``"seq"``, ``"past"``, ``"total"``: the export's dims) or gives its static
    size; ``dtype`` is ``"model"`` (the export's storage type) or a torch dtype name (``"float32"``, ``"int64"``,
    ``"bool"``)."""

    name: str
    axes: tuple[str | int, ...]
    dtype: str = "model"


@dataclass(frozen=True)
class PlanPiece:
    """One traced piece of a plan: ``module(*inputs) -> outputs`` (a tensor or a tuple).

    Pieces of one ``kind`` compute the same function of their inputs and weights, so the exporter traces the first
    one and binds a copy of its graph to each piece's own weights: the module's parameters and buffers, named in
    the graph by their names in the model. ``signature`` describes the inputs, in order (read from the first piece of
    a kind)."""

    kind: str
    name: str
    """Prefix of this copy's node and value names (``layers.3.attn``)."""
    module: nn.Module
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    signature: tuple[PlanValue, ...]


@dataclass(frozen=True)
class PlanAggregate:
    """One depth aggregation between pieces: ``AttnResAggregate(score_weight, *sources)``, or with ``norm_weight``
    ``AttnResAggregateNorm`` (the aggregation and the RMSNorm that reads it; docs/op-set.md). The weights are float32
    ``[D]`` tensors, written as initializers ``{name}.score_weight`` and ``{name}.norm_weight``."""

    name: str
    sources: tuple[str, ...]
    output: str
    score_weight: torch.Tensor
    eps: float
    norm_weight: torch.Tensor | None = None
    norm_eps: float = 0.0


@dataclass(frozen=True)
class PlanAdd:
    """``output = a + b`` (a residual stream, a block's partial sum)."""

    a: str
    b: str
    output: str


PlanStep = PlanPiece | PlanAggregate | PlanAdd


@dataclass(frozen=True)
class ExportPlan:
    """A model as the exporter assembles it (docs/exporter-notes.md#assembled-export): graph inputs, then steps in
    order, each reading values named by the graph inputs or earlier steps, and the graph outputs in order."""

    inputs: tuple[PlanValue, ...]
    steps: tuple[PlanStep, ...]
    outputs: tuple[str, ...]

    def pieces(self) -> list[PlanPiece]:
        return [step for step in self.steps if isinstance(step, PlanPiece)]


@runtime_checkable
class PlannedModel(Protocol):
    """A model that can be exported piece by piece (optional: a family without it is traced whole)."""

    def export_plan(self, with_past: bool = False, fuse_norm: bool = False) -> ExportPlan | None:
        """The plan of the plain graph (or with ``with_past``, of the with-past graph); ``fuse_norm`` as
        ``norms_fused()``. Called on the model in the export dtype. None when no two of its layers compute the same
        function (it is traced whole)."""
        ...


def step_input_axes(cache: list[CacheInput]) -> dict[str, list[str | int]]:
    """Axis names of every input of a with-past graph (``total`` = ``past + seq``)."""
    axes: dict[str, list[str | int]] = {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "total"],
                                        "position_ids": ["batch", "seq"]}
    return axes | {c.name: list(c.axes) for c in cache}


def step_output_names(cache: list[CacheInput]) -> list[str]:
    return ["logits", *(c.present for c in cache)]


def empty_past(cache: list[CacheInput], batch: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [c.empty(batch, dtype) for c in cache]


class KeepFloat32(nn.Module):
    """A module whose parameters and buffers are never rounded below float32 by ``.half()``/``.to(dtype)``.

    Aggregation weights and rotary tables are folded and applied in float32 (docs/op-set.md#attnresaggregate), so a
    float16 or bfloat16 export must not round them; a cast to float64 (`.double()`) still widens them,
    and device moves still apply. The checkpoint loader reads these modules to keep their tensors float32.
    A module that keeps only some of its tensors float32 (a router's score-correction bias, a KDA layer's decay
    parameters, as transformers' ``_keep_in_fp32_modules_strict`` does) names them in ``FLOAT32_TENSORS``.
    """

    FLOAT32_TENSORS: ClassVar[frozenset[str] | None] = None
    """Names, relative to this module, of the tensors kept float32; None: every parameter and buffer."""

    def _apply(self, fn, recurse=True):
        before = {name: t.data for name, t in self._float_tensors().items()}
        super()._apply(fn, recurse)
        for name, t in self._float_tensors().items():
            if t.dtype != before[name].dtype and t.dtype != torch.float64:
                t.data = before[name].to(t.device)  # the unrounded values, not the cast ones widened back
        return self

    def float32_state_names(self) -> list[str]:
        """The ``state_dict`` entries of this module held at least float32."""
        return [name for name in self.state_dict() if self._kept(name)]

    def _kept(self, name: str) -> bool:
        return self.FLOAT32_TENSORS is None or name in self.FLOAT32_TENSORS

    def _float_tensors(self) -> dict[str, torch.Tensor]:
        tensors = dict(self.named_parameters()) | dict(self.named_buffers())
        return {name: t for name, t in tensors.items() if self._kept(name)}


class WithPastFeeds(nn.Module):
    """Eager adapter: a with-past model called with the ONNX graph's input names (``past_key_values.0.key`` ...),
    cache tensors upcast to float32; returns the outputs in ``step_output_names`` order (the parity reference and
    the PyTorch decoder)."""

    def __init__(self, model: WithPastModel) -> None:
        super().__init__()
        self.model = model
        self.cache = model.cache_inputs()

    def forward(self, **feeds: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past = [feeds[c.name].float() for c in self.cache]
        return self.model(feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"], past)


FINGERPRINT_SAMPLES = 64
"""Elements read per tensor for a model's fingerprint: enough to tell two models apart, cheap on a 100 GB one."""


def matmul_weight_names(model: nn.Module, embeddings: bool) -> list[str]:
    """State_dict names of the weights ``model`` multiplies activations by, input axis last: every ``nn.Linear``
    weight and every parameter a module lists in ``MATMUL_WEIGHTS`` (stacked experts), and with ``embeddings`` the
    ``nn.Embedding`` tables (read by rows, blocks along the hidden axis); without it the output head too stays as
    stored. Routers, norms, convolutions and the AttnRes pseudo-queries are never among them (``--quantize``)."""
    names = []
    heads = {f"{name}.weight" for name, module in model.named_modules()
             if isinstance(module, nn.Linear) and module.out_features == getattr(model.config, "vocab_size", None)}
    for prefix, module in model.named_modules():
        own = ("weight",) if isinstance(module, nn.Linear | nn.Embedding) else ()
        for local in (*own, *getattr(module, "MATMUL_WEIGHTS", ())):
            name = f"{prefix}.{local}" if prefix else local
            if not embeddings and (isinstance(module, nn.Embedding) or name in heads):
                continue
            names.append(name)
    return names


def fingerprint(model: nn.Module) -> str:
    """A short identity of a model's config and weights, recorded in its exports so that ``generate`` and ``check``
    can tell an ONNX exported from another model. Independent of the storage type: sampled elements are widened
    to float64 first, so the float16 export of a float16 checkpoint and its float32 reference agree."""
    state = model.state_dict()
    return weights_fingerprint(model.config, {name: (t.shape, lambda t=t: t) for name, t in state.items()})


def weights_fingerprint(config: Any, tensors: dict[str, tuple[Sequence[int], Callable[[], torch.Tensor]]]) -> str:
    """``fingerprint`` of a config and its tensors (name -> shape and a read), read one at a time: a weight store
    computes the same identity as the model it builds without holding the weights."""
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
    for name, (shape, read) in sorted(tensors.items()):
        flat = read().detach().reshape(-1)
        step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
        sample = flat[::step][:FINGERPRINT_SAMPLES].to(torch.float64)
        digest.update(f"{name}:{list(shape)}".encode())
        digest.update(sample.cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
