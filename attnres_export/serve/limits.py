"""What one request to ``attnres serve`` may hold, derived from the artifact, and the check every request passes
before Triton sees it (docs/serving.md, "Request limits").

The ranges are the ones the model was exported (or the engine built) for: a shape outside them is a request the
graph was never valid for, and an id outside the vocabulary is silently wrapped by ONNX's ``Gather`` (id -1 reads
the last row). A refusal is one line naming the input and the limit (``RequestRefused``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from attnres_export.graphs.metadata import export_info
from attnres_export.serve.dependencies import ServeError
from attnres_export.serve.signature import Signature

WIRE_TYPES = {"bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "int32": "INT32", "int64": "INT64",
              "float16": "FP16", "float32": "FP32", "float64": "FP64"}
"""NumPy dtype name -> the datatype a KServe v2 request names (bfloat16 travels as FP32: signature.served_dtype)."""

JSON_BYTES_PER_VALUE = 32
"""The most text one value takes in a JSON request (a float64 repr, sign and exponent, and ``", "``)."""
BODY_OVERHEAD_BYTES = 64 * 1024
"""Room for the request's names, parameters and whitespace beside its values."""
UNBOUNDED_BODY_BYTES = 64 * 1024 * 1024
"""The body limit when some input axis has no recorded range (a foreign ONNX): the default of the
``--http-max-input-size`` that Triton releases after 2.51 have."""
CONTROL_BODY_BYTES = 64 * 1024
"""The body limit of every request that is not an inference (repository, trace, logging settings)."""
JSON_DEPTH_SLACK = 4
"""Nesting a request needs beside one level per tensor axis: the object, ``inputs``, one input, ``data``."""


class RequestRefused(ServeError):
    """A request outside the limits: ``status`` is the HTTP status (400-class) the front answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class AxisLimit:
    """One axis of an input: its dim name (``None`` for a static or unnamed axis) and the sizes it may take
    (``high`` is ``None`` when no range was recorded)."""

    label: str | None
    low: int
    high: int | None

    def describe(self) -> str:
        if self.high is None:
            return f"at least {self.low}"
        return str(self.low) if self.low == self.high else f"{self.low} to {self.high}"


@dataclass(frozen=True)
class ValueRange:
    """The values an integer input may hold, ``low <= v < high``, and what bounds them (``the vocabulary``)."""

    low: int
    high: int
    what: str


@dataclass(frozen=True)
class InputLimit:
    name: str
    dtype: str
    values: ValueRange | None = None

    @property
    def datatype(self) -> str:
        return WIRE_TYPES[self.dtype]


@dataclass(frozen=True)
class RequestLimits:
    """Every input's dtype and value range, the shapes it may take (one set per optimization profile; an ONNX has
    one), dims that must add up (``total = past + seq`` of a with-past graph), and the body and nesting limits."""

    model: str
    inputs: Mapping[str, InputLimit]
    profiles: tuple[Mapping[str, tuple[AxisLimit, ...]], ...]
    max_body_bytes: int
    max_json_depth: int
    sums: tuple[tuple[str, str, str], ...] = ()
    unbounded: tuple[str, ...] = field(default=())
    """``input axis N`` entries that have no recorded range (bounded only by ``max_body_bytes``)."""


@dataclass(frozen=True)
class RequestTensor:
    """One input of a request as it arrived: ``data`` is a nested list (JSON), raw little-endian bytes (binary
    extension, gRPC raw contents) or a sequence of numbers (gRPC typed contents)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: object


def _body_bytes(inputs: Mapping[str, InputLimit], profiles: Sequence[Mapping[str, tuple[AxisLimit, ...]]]) -> int:
    largest = 0
    for profile in profiles:
        values = 0
        for name in inputs:
            highs = [a.high for a in profile[name]]
            if any(h is None for h in highs):
                return UNBOUNDED_BODY_BYTES
            values += math.prod(highs)
        largest = max(largest, values)
    return BODY_OVERHEAD_BYTES + largest * JSON_BYTES_PER_VALUE


def _build(model: str, inputs: dict[str, InputLimit], profiles: list[dict[str, tuple[AxisLimit, ...]]],
           sums: tuple[tuple[str, str, str], ...] = ()) -> RequestLimits:
    rank = max((len(axes) for p in profiles for axes in p.values()), default=0)
    unbounded = tuple(f"{name} axis {i}" for name, axes in profiles[0].items() for i, a in enumerate(axes)
                      if a.high is None)
    return RequestLimits(model, inputs, tuple(profiles), _body_bytes(inputs, profiles), JSON_DEPTH_SLACK + rank,
                         sums, unbounded)


def _value_ranges(signature: Signature, info: dict) -> dict[str, ValueRange]:
    """Token ids index the embedding (``vocab_size`` in the metadata, else the last dim of ``logits``);
    position ids index the rotary table (``max_seq_len``)."""
    ranges = {}
    logits = next((s for s in signature.outputs if s.name == "logits"), None)
    vocab = info.get("vocab_size") or (logits.dims[-1] if logits is not None and logits.dims[-1] > 0 else None)
    if vocab:
        ranges["input_ids"] = ValueRange(0, int(vocab), f"the vocabulary of {int(vocab)} tokens")
    if info.get("max_seq_len"):
        ranges["position_ids"] = ValueRange(0, int(info["max_seq_len"]), f"max_seq_len {info['max_seq_len']}")
    return ranges


def _input_limits(signature: Signature, info: dict) -> dict[str, InputLimit]:
    ranges = _value_ranges(signature, info)
    limits = {}
    for spec in signature.inputs:
        dtype = spec.served_dtype
        if dtype not in WIRE_TYPES:
            raise ServeError(f"input {spec.name!r} has type {spec.dtype}, which attnres serve cannot check")
        limits[spec.name] = InputLimit(spec.name, dtype, ranges.get(spec.name) if dtype.startswith("int") else None)
    return limits


def onnx_limits(model_name: str, model: onnx.ModelProto, signature: Signature) -> RequestLimits:
    """An ONNX's limits: each dim named in the export metadata takes its recorded range (axis 0 of a batched
    signature at most ``signature.max_batch``); a static axis its size."""
    info = export_info(model)
    recorded = info.get("inputs", {})
    dims = info.get("dims", {})
    initializers = {i.name for i in model.graph.initializer}
    profile: dict[str, tuple[AxisLimit, ...]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        axes = []
        labels = recorded.get(value.name, [])
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            label = labels[axis] if axis < len(labels) and isinstance(labels[axis], str) else (
                dim.dim_param if dim.HasField("dim_param") and dim.dim_param else None)
            if dim.HasField("dim_value") and dim.dim_value > 0:
                axes.append(AxisLimit(label, dim.dim_value, dim.dim_value))
                continue
            low, high = (int(dims[label][0]), int(dims[label][2])) if label in dims else (0, None)
            if axis == 0 and signature.batched:
                low, high = max(low, 1), signature.max_batch if high is None else min(high, signature.max_batch)
            axes.append(AxisLimit(label, low, high))
        profile[value.name] = tuple(axes)
    sums = (("total", "past", "seq"),) if info.get("with_past") and {"total", "past", "seq"} <= set(dims) else ()
    return _build(model_name, _input_limits(signature, info), [profile], sums)


def engine_limits(model_name: str, signature: Signature) -> RequestLimits:
    """An engine's limits: a request must fit one of its optimization profiles (the manifest's, else profile 0)."""
    profiles = []
    for recorded in signature.profiles:
        profile = {}
        for spec in signature.inputs:
            if spec.name not in recorded:
                raise ServeError(f"the engine's profiles name no shapes for input {spec.name!r}; rebuild it")
            low, high = recorded[spec.name]["min"], recorded[spec.name]["max"]
            axes = [AxisLimit(None, int(lo), int(hi)) for lo, hi in zip(low, high, strict=True)]
            if signature.batched:
                axes[0] = AxisLimit("batch", axes[0].low, min(axes[0].high, signature.max_batch))
            profile[spec.name] = tuple(axes)
        profiles.append(profile)
    return _build(model_name, _input_limits(signature, {}), profiles)


def _shape(tensor: RequestTensor) -> tuple[int, ...]:
    shape = tensor.shape
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                       for d in shape):
        raise RequestRefused(f"input {tensor.name!r}: shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise RequestRefused(f"input {tensor.name!r}: shape {list(shape)} has a negative dim")
    return tuple(shape)


def _profile_error(limits: RequestLimits, profile: Mapping[str, tuple[AxisLimit, ...]],
                   shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    sizes: dict[str, tuple[str, int]] = {}
    for name, shape in shapes.items():
        axes = profile[name]
        if len(shape) != len(axes):
            return (f"input {name!r} has shape {list(shape)} ({len(shape)} dims); this model takes {len(axes)} "
                    f"dims ({', '.join(a.label or str(a.low) for a in axes)})")
        for axis, (size, limit) in enumerate(zip(shape, axes, strict=True)):
            label = f" ({limit.label})" if limit.label else ""
            if size < limit.low or (limit.high is not None and size > limit.high):
                return (f"input {name!r} dim {axis}{label} is {size}; this model accepts "
                        f"{limit.describe()}{' (the range it was exported for)' if limit.label else ''}")
            if limit.label:
                seen = sizes.setdefault(limit.label, (name, size))
                if seen[1] != size:
                    return (f"input {name!r} dim {axis} ({limit.label}) is {size}, but input {seen[0]!r} has "
                            f"{limit.label} {seen[1]}; they must agree")
    for total, first, second in limits.sums:
        named = total in sizes and first in sizes and second in sizes
        if named and sizes[total][1] != sizes[first][1] + sizes[second][1]:
            return (f"input {sizes[total][0]!r} has {total} {sizes[total][1]}; it must be {first} + {second} "
                    f"= {sizes[first][1]} + {sizes[second][1]}")
    return None


def check_header(limits: RequestLimits, tensors: Sequence[RequestTensor]) -> dict[str, tuple[int, ...]]:
    """Names, datatypes and shapes (before any value is read); returns each input's shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    for tensor in tensors:
        if tensor.name not in limits.inputs:
            raise RequestRefused(f"input {tensor.name!r} is not an input of model {limits.model!r} (its inputs: "
                                 f"{', '.join(limits.inputs)})")
        if tensor.name in shapes:
            raise RequestRefused(f"input {tensor.name!r} is given twice")
        expected = limits.inputs[tensor.name].datatype
        if tensor.datatype != expected:
            raise RequestRefused(f"input {tensor.name!r} has datatype {tensor.datatype!r}; this model takes "
                                 f"{expected}")
        shapes[tensor.name] = _shape(tensor)
    missing = [name for name in limits.inputs if name not in shapes]
    if missing:
        raise RequestRefused(f"input {missing[0]!r} is missing (model {limits.model!r} needs "
                             f"{', '.join(limits.inputs)})")
    errors = [_profile_error(limits, p, shapes) for p in limits.profiles]
    if all(errors):
        if len(errors) == 1:
            raise RequestRefused(errors[0])
        raise RequestRefused(f"the input shapes fit none of the engine's {len(errors)} optimization profiles "
                             f"(profile 0: {errors[0]})")
    return shapes


def _decode(tensor: RequestTensor, limit: InputLimit, count: int) -> np.ndarray:
    dtype = np.dtype(limit.dtype).newbyteorder("<")
    if isinstance(tensor.data, (bytes, bytearray, memoryview)):
        raw = bytes(tensor.data)
        if len(raw) != count * dtype.itemsize:
            raise RequestRefused(f"input {tensor.name!r} carries {len(raw)} bytes; shape {list(tensor.shape)} of "
                                 f"{limit.datatype} needs {count * dtype.itemsize}")
        return np.frombuffer(raw, dtype=dtype)
    try:
        values = np.asarray(tensor.data)
    except (ValueError, TypeError, OverflowError):
        raise RequestRefused(f"input {tensor.name!r}: data is not a rectangular array of numbers") from None
    accepted = {"b": "b", "i": "iu", "u": "iu", "f": "fiu"}[dtype.kind]
    if values.size and values.dtype.kind not in accepted:
        raise RequestRefused(f"input {tensor.name!r}: data holds {values.dtype.kind!r}-kind values "
                             f"({values.dtype}), not {limit.datatype}")
    if values.size != count:
        raise RequestRefused(f"input {tensor.name!r} holds {values.size} values; shape {list(tensor.shape)} needs "
                             f"{count}")
    if values.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise RequestRefused(f"input {tensor.name!r} holds values outside {limit.datatype}")
    return values.reshape(-1)


def check_values(limits: RequestLimits, tensor: RequestTensor, shape: tuple[int, ...]) -> None:
    """The value count matches the shape, values fit the datatype, and ids lie in their range."""
    limit = limits.inputs[tensor.name]
    values = _decode(tensor, limit, math.prod(shape))
    bound = limit.values
    if bound is None or not values.size:
        return
    outside = (values < bound.low) | (values >= bound.high)
    if outside.any():
        raise RequestRefused(f"input {tensor.name!r} holds {int(values[np.argmax(outside)])}; values must lie in "
                             f"[{bound.low}, {bound.high}) ({bound.what})")


def check_request(limits: RequestLimits, tensors: Sequence[RequestTensor]) -> None:
    """Every check of one inference request; raises ``RequestRefused`` (one line) at the first violation."""
    shapes = check_header(limits, tensors)
    for tensor in tensors:
        check_values(limits, tensor, shapes[tensor.name])
