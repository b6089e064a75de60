"""One descriptor per op of the attnres set: everything the rest of the package needs to know about an op.

The exporter (translation), the targets (decomposition, compact spelling), convert, inspect, the TensorRT
preflight, the ONNX schemas, the type proxy and the ONNX Runtime reference ops all read an ``OpDescriptor``
instead of switching on op types. Adding an op is one descriptor here plus its kernel folder
(docs/op-set.md#adding-an-op). Every reader of an ONNX validates attnres nodes through ``node_problems``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from attnres_export.ops.decompose_aggregate import decompose_aggregate
from attnres_export.ops.decompose_aggregate_norm import decompose_aggregate_norm
from attnres_export.ops.decompose_attention import decompose_residual_attention
from attnres_export.ops.decompose_kimi_delta import decompose_kimi_delta
from attnres_export.ops.numpy_ref import (
    attnres_aggregate_norm_numpy,
    attnres_aggregate_numpy,
    kimi_delta_attention_numpy,
    residual_score_attention_numpy,
)
from attnres_export.ops.onnx_nodes import Fresh, attribute
from attnres_export.ops.opset import (
    AGGREGATE,
    AGGREGATE_NORM,
    DOMAIN,
    KIMI_DELTA_ATTENTION,
    MAX_SOURCES,
    ORT_TRT_DOMAIN,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    RESIDUAL_ATTENTION,
)

Shape = tuple[int | None, ...] | None
"""A value's static shape (``None`` for an unknown dim, or for an unknown shape)."""


@dataclass(frozen=True)
class InputSpec:
    """One formal input; ``storage`` inputs have the storage type T, the others are float32."""

    name: str
    storage: bool
    doc: str
    kind: str = "single"
    """``single`` (required), ``optional`` or ``variadic`` (1..max_arity tensors, last input only)."""
    presence_attribute: str | None = None
    """For optional inputs: the int attribute saying whether it is listed, in the compact spelling."""


@dataclass(frozen=True)
class OutputSpec:
    name: str
    storage: bool
    doc: str
    presence_attribute: str | None = None
    """For an optional output: the int attribute saying whether it is listed, in the compact spelling. In the ONNX
    spelling an optional output is listed or not (trailing) and needs no attribute."""


@dataclass(frozen=True)
class AttributeSpec:
    """A float attribute: required, a plugin field, and valid when ``valid(value)`` holds."""

    name: str
    doc: str
    rule: str
    """What a valid value is, for messages: ``a finite number >= 0``."""
    valid: Callable[[float], bool]


Translation = Callable[[Any, dict[str, str]], Callable[..., Any]]
"""(onnxscript Op, plugin attributes) -> the torch.onnx translation function of the op's custom torch op."""
Decomposition = Callable[[onnx.NodeProto, list[str], int, int, Fresh], list[onnx.NodeProto]]
"""(node, canonical inputs, storage type, default opset, fresh names) -> standard ONNX nodes."""
NumpyReference = Callable[[list[np.ndarray | None], dict[str, float]], tuple[np.ndarray, ...]]
"""(canonical inputs with None for absent ones, attributes) -> outputs, computed in float32."""


@dataclass(frozen=True)
class OpDescriptor:
    op_type: str
    """ONNX op type and TensorRT plugin name."""
    torch_op: str
    """``namespace::name`` of the PyTorch custom op the reference models call."""
    doc: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    attributes: tuple[AttributeSpec, ...]
    numpy_reference: NumpyReference
    decompose: Decomposition
    translation: Translation
    shape_problem: Callable[[list[Shape]], str | None]
    """A problem with the static shapes of the canonical inputs, or None."""
    max_arity: int = 1
    """Most tensors the variadic input takes."""
    min_opset: int = 17
    """Lowest default-domain opset the decomposition is written for."""
    has_plugin: bool = True
    """Whether ``attnres_export/plugins/`` holds a TensorRT plugin for the op. An op without one is complete
    everywhere else: the ``tensorrt`` target still writes its node (for the plugin to come), the references and
    the ``portable`` decomposition run it, and ``attnres build`` refuses it by name."""

    @property
    def variadic(self) -> InputSpec | None:
        return next((i for i in self.inputs if i.kind == "variadic"), None)

    @property
    def input_presence_attributes(self) -> tuple[str, ...]:
        return tuple(i.presence_attribute for i in self.inputs if i.presence_attribute)

    @property
    def output_presence_attributes(self) -> tuple[str, ...]:
        return tuple(o.presence_attribute for o in self.outputs if o.presence_attribute)

    @property
    def presence_attributes(self) -> tuple[str, ...]:
        """Every int flag of the compact spelling: the optional inputs', then the optional outputs'."""
        return (*self.input_presence_attributes, *self.output_presence_attributes)

    @property
    def required_outputs(self) -> tuple[OutputSpec, ...]:
        return tuple(o for o in self.outputs if o.presence_attribute is None)

    @property
    def plugin_fields(self) -> tuple[str, ...]:
        """The TensorRT plugin fields: every attribute, then the presence flags."""
        return (*(a.name for a in self.attributes), *self.presence_attributes)

    @property
    def storage_input(self) -> int:
        """Position (in the canonical inputs) of the first input of storage type T."""
        return next(i for i, spec in enumerate(self.inputs) if spec.storage)

    def is_compact(self, node: onnx.NodeProto) -> bool:
        """Does ``node`` use the compact spelling (present inputs only, plus presence flags)?"""
        return any(attribute(node, name) is not None for name in self.presence_attributes)

    def canonical_inputs(self, node: onnx.NodeProto) -> list[str]:
        """One name per formal position (a variadic input expands to its tensors), ``""`` for an absent one."""
        names = list(node.input)
        if self.variadic is not None:
            return names
        if not self.is_compact(node):
            return [*names, *[""] * (len(self.inputs) - len(names))][: max(len(self.inputs), len(names))]
        present = iter(names)
        canonical = []
        for spec in self.inputs:
            listed = spec.presence_attribute is None or bool(attribute(node, spec.presence_attribute))
            canonical.append(next(present, "") if listed else "")
        return canonical

    def spec_of(self, position: int) -> InputSpec:
        """The formal input at canonical ``position`` (positions past the fixed ones belong to the variadic)."""
        return self.inputs[min(position, len(self.inputs) - 1)]

    def compact(self, node: onnx.NodeProto) -> None:
        """Rewrite ``node`` in place to the compact spelling (the ``tensorrt`` and ``ort-trt`` targets)."""
        if not self.presence_attributes:
            return
        names = self.canonical_inputs(node)
        outputs = self.listed_outputs(node)
        _set_inputs(node, [name for name in names if name])
        self.drop_presence(node)
        if self.variadic is None:
            for spec, name in zip(self.inputs, names, strict=True):
                if spec.presence_attribute:
                    node.attribute.append(onnx.helper.make_attribute(spec.presence_attribute, int(bool(name))))
        if self.output_presence_attributes:
            for spec, name in zip(self.outputs, outputs, strict=False):
                if spec.presence_attribute:
                    node.attribute.append(onnx.helper.make_attribute(spec.presence_attribute, int(bool(name))))
            _set_outputs(node, _without_trailing_empty(outputs))

    def listed_outputs(self, node: onnx.NodeProto) -> list[str]:
        """One name per formal output, ``""`` for an absent optional one (both spellings)."""
        names = [*node.output, *[""] * (len(self.outputs) - len(node.output))]
        if not self.is_compact(node):
            return names[: max(len(self.outputs), len(node.output))]
        present = iter(node.output)
        return [next(present, "") if spec.presence_attribute is None or attribute(node, spec.presence_attribute)
                else "" for spec in self.outputs]

    def expand(self, node: onnx.NodeProto) -> None:
        """Rewrite ``node`` in place to the ONNX spelling: every position, empty names for absent inputs."""
        if not self.presence_attributes:
            return
        outputs = self.listed_outputs(node)
        _set_inputs(node, _without_trailing_empty(self.canonical_inputs(node)))
        if self.output_presence_attributes:
            _set_outputs(node, _without_trailing_empty(outputs))
        self.drop_presence(node)

    def drop_presence(self, node: onnx.NodeProto) -> None:
        kept = [a for a in node.attribute if a.name not in self.presence_attributes]
        del node.attribute[:]
        node.attribute.extend(kept)

    def arity(self, node: onnx.NodeProto) -> int:
        """Tensors of the variadic input, else present inputs: the number ``attnres inspect`` reports."""
        names = self.canonical_inputs(node)
        if self.variadic is not None:
            return len(names) - (len(self.inputs) - 1)
        return sum(1 for name in names if name)

    def node_problems(self, node: onnx.NodeProto) -> list[str]:
        """What makes ``node`` break the op's contract, without looking at shapes (docs/op-set.md)."""
        problems = [*self._attribute_problems(node), *self._spelling_problems(node)]
        if problems:
            return problems
        names = self.canonical_inputs(node)
        fixed = [s for s in self.inputs if s.kind != "variadic"]
        for position, spec in enumerate(fixed):
            if spec.kind == "single" and (position >= len(names) or not names[position]):
                problems.append(f"missing input {spec.name}")
        variadic = self.variadic
        if variadic is not None:
            count = max(len(names) - len(fixed), 0)
            if not 1 <= count <= self.max_arity or not all(names[len(fixed):]):
                problems.append(f"has {count} {variadic.name}; takes 1..{self.max_arity} non-empty ones")
        elif len(names) > len(self.inputs):
            problems.append(f"has {len(names)} inputs; takes at most {len(self.inputs)}")
        return [*problems, *self._output_problems(node)]

    def _output_problems(self, node: onnx.NodeProto) -> list[str]:
        if len(node.output) > len(self.outputs):
            return [f"has {len(node.output)} outputs; has at most {len(self.outputs)}"]
        return [] if node.output and node.output[0] else [f"missing output {self.outputs[0].name}"]

    def _attribute_problems(self, node: onnx.NodeProto) -> list[str]:
        problems = []
        for spec in self.attributes:
            value = attribute(node, spec.name)
            if value is None:
                problems.append(f"missing attribute {spec.name} ({spec.rule})")
            elif not isinstance(value, float | int) or isinstance(value, bool) or not spec.valid(float(value)):
                problems.append(f"attribute {spec.name} is {value!r}; it must be {spec.rule}")
        return problems

    def _spelling_problems(self, node: onnx.NodeProto) -> list[str]:
        if not self.is_compact(node):
            return []
        problems = []
        for name in self.presence_attributes:
            flag = attribute(node, name, 0)
            if flag not in (0, 1):
                problems.append(f"attribute {name} is {flag!r}; it must be 0 or 1")
        if problems:
            return problems
        for kind, specs, names in (("inputs", self.inputs, node.input), ("outputs", self.outputs, node.output)):
            flags = [spec.presence_attribute for spec in specs if spec.presence_attribute]
            if not flags:
                continue
            listed = sum(1 for spec in specs if not spec.presence_attribute or attribute(node, spec.presence_attribute))
            if len(names) != listed or "" in names:
                problems.append(f"lists {len(names)} {kind} but its presence attributes ({', '.join(flags)}) say "
                                f"{listed} non-empty ones")
        return problems


def _without_trailing_empty(names: Sequence[str]) -> list[str]:
    names = list(names)
    while names and not names[-1]:
        names.pop()
    return names


def _set_inputs(node: onnx.NodeProto, names: Sequence[str]) -> None:
    del node.input[:]
    node.input.extend(names)


def _set_outputs(node: onnx.NodeProto, names: Sequence[str]) -> None:
    del node.output[:]
    node.output.extend(names)


def _finite_non_negative(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _finite_non_zero(value: float) -> bool:
    return math.isfinite(value) and value != 0


def _aggregate_translation(op, plugin: dict[str, str]):
    def translate(score_weight, sources, eps: float):
        return op(score_weight, *sources, eps=eps, **plugin)

    return translate


def _aggregate_shapes(shapes: list[Shape]) -> str | None:
    return _vector_problem("score_weight", shapes[0], shapes[1:])


def _vector_problem(name: str, weight: Shape, sources: list[Shape]) -> str | None:
    """A problem with a ``[D]`` weight of an aggregation whose sources have ``shapes``, or None."""
    if weight is None:
        return None
    if len(weight) != 1:
        return f"{name} has rank {len(weight)}; it must be [D]"
    dims = {s[-1] for s in sources if s and s[-1] is not None}
    if weight[0] is not None and dims and dims != {weight[0]}:
        return f"{name} has length {weight[0]} but the sources' last dim is {', '.join(map(str, sorted(dims)))}"
    return None


def _aggregate_norm_translation(op, plugin: dict[str, str]):
    def translate(score_weight, norm_weight, sources, eps: float, norm_eps: float):
        """The torch op returns ``y`` only, so the traced node lists one output."""
        return op(score_weight, norm_weight, *sources, eps=eps, norm_eps=norm_eps, **plugin)

    return translate


def _aggregate_norm_shapes(shapes: list[Shape]) -> str | None:
    sources = shapes[2:]
    return _vector_problem("score_weight", shapes[0], sources) or _vector_problem("norm_weight", shapes[1], sources)


def _attention_translation(op, plugin: dict[str, str]):
    def translate(q, k, v, prev_scores, mask_bias, scale: float, logit_divisor: float):
        """One node with two outputs; an absent optional input becomes an empty input name."""
        return op(q, k, v, prev_scores, mask_bias, scale=scale, logit_divisor=logit_divisor, **plugin)

    return translate


def _attention_shapes(shapes: list[Shape]) -> str | None:
    ranks = [len(s) for s in shapes[:3] if s is not None]
    if any(r != 4 for r in ranks):
        return f"q, k and v must be 4-D [B, H, T, d]; got ranks {ranks}"
    return None


def _kimi_delta_translation(op, plugin: dict[str, str]):
    def translate(q, k, v, g, beta, initial_state, scale: float, l2norm_eps: float):
        """One node with two outputs: the tokens' outputs and the state after them."""
        return op(q, k, v, g, beta, initial_state, scale=scale, l2norm_eps=l2norm_eps, **plugin)

    return translate


def _kimi_delta_shapes(shapes: list[Shape]) -> str | None:
    q, k, v, g, beta, state = shapes
    ranks = {"q": (q, 4), "k": (k, 4), "v": (v, 4), "g": (g, 4), "beta": (beta, 3), "initial_state": (state, 4)}
    wrong = [f"{name} has rank {len(shape)}, not {rank}" for name, (shape, rank) in ranks.items()
             if shape is not None and len(shape) != rank]
    if wrong:
        return "; ".join(wrong) + " (q, k, g [B,T,H,dk], v [B,T,H,dv], beta [B,T,H], initial_state [B,H,dk,dv])"
    dims: dict[str, set[int]] = {}
    layout = {"q": "BTHK", "k": "BTHK", "g": "BTHK", "v": "BTHV", "beta": "BTH", "initial_state": "BHKV"}
    for name, letters in layout.items():
        shape = ranks[name][0]
        for letter, dim in zip(letters, shape or (), strict=False):
            if dim is not None and letter != "T":
                dims.setdefault(letter, set()).add(dim)
    clash = {letter: sorted(values) for letter, values in dims.items() if len(values) > 1}
    if clash:
        return ("the shapes do not fit q, k, g [B,T,H,dk], v [B,T,H,dv], beta [B,T,H], initial_state [B,H,dk,dv]: "
                + ", ".join(f"{letter} is {' and '.join(map(str, values))}" for letter, values in clash.items()))
    return None


AGGREGATE_OP = OpDescriptor(
    op_type=AGGREGATE,
    torch_op="attnres::aggregate",
    doc="Softmax-weighted sum of the sources over depth (docs/op-set.md#attnresaggregate).",
    inputs=(
        InputSpec("score_weight", False, "folded gain * pseudo-query, [D], float32"),
        InputSpec("sources", True, f"1..{MAX_SOURCES} tensors [..., D]", kind="variadic"),
    ),
    outputs=(OutputSpec("h", True, "aggregated representation [..., D]"),),
    attributes=(AttributeSpec("eps", "added to the mean square", "a finite number >= 0", _finite_non_negative),),
    numpy_reference=lambda inputs, attrs: (attnres_aggregate_numpy(inputs[0], inputs[1:], attrs["eps"]),),
    decompose=decompose_aggregate,
    translation=_aggregate_translation,
    shape_problem=_aggregate_shapes,
    max_arity=MAX_SOURCES,
)

AGGREGATE_NORM_OP = OpDescriptor(
    op_type=AGGREGATE_NORM,
    torch_op="attnres::aggregate_norm",
    doc="A depth aggregation followed by the RMSNorm that reads it (docs/op-set.md#attnresaggregatenorm).",
    inputs=(
        InputSpec("score_weight", False, "folded gain * pseudo-query, [D], float32"),
        InputSpec("norm_weight", False, "RMSNorm weight, [D], float32"),
        InputSpec("sources", True, f"1..{MAX_SOURCES} tensors [..., D]", kind="variadic"),
    ),
    outputs=(
        OutputSpec("y", True, "RMSNorm of the aggregate [..., D]"),
        OutputSpec("h", True, "the aggregate [..., D], rounded to T; optional", presence_attribute="has_aggregate"),
    ),
    attributes=(
        AttributeSpec("eps", "added to the mean square of each source", "a finite number >= 0", _finite_non_negative),
        AttributeSpec("norm_eps", "added to the mean square of the aggregate", "a finite number >= 0",
                      _finite_non_negative),
    ),
    numpy_reference=lambda inputs, attrs: attnres_aggregate_norm_numpy(
        inputs[0], inputs[1], inputs[2:], attrs["eps"], attrs["norm_eps"]),
    decompose=decompose_aggregate_norm,
    translation=_aggregate_norm_translation,
    shape_problem=_aggregate_norm_shapes,
    max_arity=MAX_SOURCES,
)

RESIDUAL_ATTENTION_OP = OpDescriptor(
    op_type=RESIDUAL_ATTENTION,
    torch_op="attnres::residual_score_attention",
    doc="Attention whose raw scores add the previous layer's (RealFormer, docs/op-set.md#residualscoreattention).",
    inputs=(
        InputSpec("q", True, "queries [B, H, Tq, dh]"),
        InputSpec("k", True, "keys [B, H, Tk, dh]"),
        InputSpec("v", True, "values [B, H, Tk, dv]"),
        InputSpec("prev_scores", False, "previous running score sum [B, H, Tq, Tk]; absent at the first layer",
                  kind="optional", presence_attribute="has_prev_scores"),
        InputSpec("mask_bias", False, "additive bias broadcastable to [B, H, Tq, Tk]; not carried",
                  kind="optional", presence_attribute="has_mask"),
    ),
    outputs=(
        OutputSpec("out", True, "attention output [B, H, Tq, dv]"),
        OutputSpec("scores", False, "scale*QK^T + prev_scores [B, H, Tq, Tk], pre-mask and pre-divisor"),
    ),
    attributes=(
        AttributeSpec("scale", "multiplies QK^T (1/sqrt(dh))", "a finite number", math.isfinite),
        AttributeSpec("logit_divisor", "divides the scores before the mask (1, or l+1 for the running mean)",
                      "a finite non-zero number", _finite_non_zero),
    ),
    numpy_reference=lambda inputs, attrs: residual_score_attention_numpy(
        *inputs, attrs["scale"], attrs["logit_divisor"]),
    decompose=decompose_residual_attention,
    translation=_attention_translation,
    shape_problem=_attention_shapes,
)

KIMI_DELTA_ATTENTION_OP = OpDescriptor(
    op_type=KIMI_DELTA_ATTENTION,
    torch_op="attnres::kimi_delta_attention",
    doc="The gated delta rule of Kimi Delta Attention over T tokens from a state (docs/op-set.md#kimideltaattention).",
    inputs=(
        InputSpec("q", True, "queries [B, T, H, dk], before their L2 norm"),
        InputSpec("k", True, "keys [B, T, H, dk], before their L2 norm"),
        InputSpec("v", True, "values [B, T, H, dv]"),
        InputSpec("g", False, "log of the channel-wise decay [B, T, H, dk] (<= 0), float32"),
        InputSpec("beta", True, "write strength [B, T, H], in (0, 1)"),
        InputSpec("initial_state", False, "recurrent state before the first token [B, H, dk, dv], float32"),
    ),
    outputs=(
        OutputSpec("out", True, "per-token outputs [B, T, H, dv]"),
        OutputSpec("final_state", False, "recurrent state after the last token [B, H, dk, dv], float32"),
    ),
    attributes=(
        AttributeSpec("scale", "multiplies the L2-normalised queries (1/sqrt(dk))", "a finite number", math.isfinite),
        AttributeSpec("l2norm_eps", "added to the sum of squares of q and k under the root", "a finite number >= 0",
                      _finite_non_negative),
    ),
    numpy_reference=lambda inputs, attrs: kimi_delta_attention_numpy(
        *inputs, attrs["scale"], attrs["l2norm_eps"]),
    decompose=decompose_kimi_delta,
    translation=_kimi_delta_translation,
    shape_problem=_kimi_delta_shapes,
    has_plugin=False,
)

OPS: dict[str, OpDescriptor] = {d.op_type: d for d in (AGGREGATE_OP, AGGREGATE_NORM_OP, RESIDUAL_ATTENTION_OP,
                                                        KIMI_DELTA_ATTENTION_OP)}
"""Op type -> descriptor: every op of the attnres domain."""

PLUGIN_ATTRIBUTES = {"plugin_version": PLUGIN_VERSION, "plugin_namespace": PLUGIN_NAMESPACE}
"""String attributes every node carries so that TensorRT's parser picks our plugin."""

ATTNRES_DOMAINS = (DOMAIN, ORT_TRT_DOMAIN)
"""Domains an attnres node may be in: its own, or ONNX Runtime's TensorRT-plugin domain (ort-trt target)."""


def is_attnres(node: onnx.NodeProto) -> bool:
    return node.domain in ATTNRES_DOMAINS


def descriptor_of(node: onnx.NodeProto) -> OpDescriptor | None:
    """The descriptor of an attnres node, None for an op type the set does not define."""
    return OPS.get(node.op_type)
