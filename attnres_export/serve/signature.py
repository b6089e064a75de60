"""An artifact's inputs and outputs as Triton sees them: names, Triton data types, dims (-1 where dynamic) and
whether axis 0 is a batch axis Triton may batch along.

An ONNX's signature comes from its graph and export metadata; an engine's from the engine itself (through the
TensorRT runner) and its manifest's optimization profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from attnres_export.dtypes import onnx_type_name
from attnres_export.graphs.metadata import export_info
from attnres_export.serve.dependencies import ServeError

TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "int8": "TYPE_INT8", "int32": "TYPE_INT32", "int64": "TYPE_INT64",
    "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64", "bfloat16": "TYPE_BF16",
}
"""NumPy/torch dtype name -> Triton's ``DataType`` name (model_config.proto)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, dtype name and full dims (batch axis included, -1 where dynamic)."""

    name: str
    dtype: str
    dims: tuple[int, ...]

    @property
    def triton_type(self) -> str:
        if self.dtype not in TRITON_TYPES:
            raise ServeError(f"tensor {self.name!r} has type {self.dtype}, which Triton has no type for")
        return TRITON_TYPES[self.dtype]

    @property
    def served_dtype(self) -> str:
        """The NumPy dtype the PyTriton server exchanges: NumPy has no bfloat16, so bfloat16 travels as float32."""
        return "float32" if self.dtype == "bfloat16" else self.dtype


@dataclass(frozen=True)
class Signature:
    """Inputs, outputs, and the batch axis: ``max_batch`` > 0 when axis 0 of every input and output is dynamic
    (Triton's dims then leave it out), else 0 (the tensors are sent whole)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int
    profiles: list[dict] = field(default_factory=list)

    @property
    def batched(self) -> bool:
        return self.max_batch > 0

    def triton_dims(self, spec: TensorSpec) -> list[int]:
        return list(spec.dims[1:] if self.batched else spec.dims)

    def with_max_batch(self, wanted: int | None) -> Signature:
        """This signature batching at most ``wanted`` (refused above the artifact's own range)."""
        if wanted is None:
            return self
        if wanted < 1:
            raise ServeError(f"--max-batch {wanted}: must be at least 1")
        if not self.batched:
            raise ServeError(f"--max-batch {wanted}: the model's axis 0 is not a dynamic batch axis on every input "
                             "and output, so Triton cannot batch it; leave --max-batch out")
        if wanted > self.max_batch:
            raise ServeError(f"--max-batch {wanted} is over the batch range the artifact was exported/built for "
                             f"(at most {self.max_batch}); re-export with --batch MIN:OPT:{wanted}")
        return Signature(self.inputs, self.outputs, wanted, self.profiles)


def _onnx_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise ServeError(f"graph input/output {value.name!r} is not a tensor; Triton serves tensors only")
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim)
    return TensorSpec(value.name, onnx_type_name(tensor.elem_type), dims)


def onnx_signature(model: onnx.ModelProto) -> Signature:
    """The signature of an ONNX; its batch limit is the exported batch range's maximum (else 0: no batching)."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = tuple(_onnx_spec(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_onnx_spec(v) for v in model.graph.output)
    batch_range = export_info(model).get("dims", {}).get("batch")
    dynamic = all(s.dims and s.dims[0] == -1 for s in (*inputs, *outputs))
    max_batch = int(batch_range[2]) if dynamic and batch_range else 0
    return Signature(inputs, outputs, max_batch)


def engine_signature(runner) -> Signature:
    """The signature of a loaded ``TensorRTRunner``'s engine; profiles and the batch limit from its manifest
    (else from the engine's profile 0)."""
    from attnres_export.dtypes import TENSORRT_TO_NAME

    runner.load()
    engine = runner.engine

    def spec(name: str) -> TensorSpec:
        kind = engine.get_tensor_dtype(name).name
        if kind not in TENSORRT_TO_NAME:
            raise ServeError(f"engine tensor {name!r} has type {kind}, which attnres cannot serve")
        return TensorSpec(name, TENSORRT_TO_NAME[kind], tuple(int(d) for d in engine.get_tensor_shape(name)))

    inputs = tuple(spec(n) for n in runner.io_names(True))
    outputs = tuple(spec(n) for n in runner.io_names(False))
    manifest = runner.manifest
    profiles = list(manifest.profiles) if manifest is not None else [
        {s.name: dict(zip(("min", "opt", "max"), (list(x) for x in engine.get_tensor_profile_shape(s.name, 0)),
                          strict=True)) for s in inputs}]
    dynamic = all(s.dims and s.dims[0] == -1 for s in (*inputs, *outputs))
    max_batch = 0
    if dynamic:
        # Triton's TensorRT backend needs every profile to accept every batch size up to max_batch_size.
        max_batch = min(int(p[s.name]["max"][0]) for p in profiles for s in inputs if s.name in p)
    return Signature(inputs, outputs, max_batch, profiles)


def numpy_dtype(name: str) -> np.dtype:
    return np.dtype(name)


def is_engine(path: Path) -> bool:
    return Path(path).suffix != ".onnx"
