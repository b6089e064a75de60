"""Whether a with-past ONNX was exported from the model ``attnres generate`` pairs it with (docs/decode.md#generation).

The graph tells it twice. Its metadata records the model's ``model_id`` (``models.base.fingerprint``) and
vocabulary, unless the metadata was stripped or copied from another file; its weights are harder to fake and cheap
to compare: the first ``IDENTITY_SAMPLES`` values of the ``IDENTITY_TENSORS`` largest initializers that carry a
state_dict name (the embedding, the experts; not those the ``onnxruntime`` target reordered) against the model's,
cast to the initializer's type. No more of a tensor is read, so a model of many GB is paired in milliseconds.
Where neither can be compared, the caller says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from attnres_export.errors import GenerationError
from attnres_export.graphs.metadata import export_info
from attnres_export.graphs.onnxruntime_ops import OnnxRuntimeOps
from attnres_export.models.base import fingerprint

IDENTITY_SAMPLES = 256
"""Values compared per initializer: another model's random or trained weights differ in nearly every one."""
IDENTITY_TENSORS = 3
_STORED = {onnx.TensorProto.FLOAT: ("<f4", torch.float32), onnx.TensorProto.FLOAT16: ("<f2", torch.float16),
           onnx.TensorProto.BFLOAT16: ("<u2", torch.bfloat16), onnx.TensorProto.DOUBLE: ("<f8", torch.float64)}
"""Per initializer type: its little-endian raw layout and the torch type the model's tensor is cast to."""


def refuse_other_model(path: Path, graph: onnx.ModelProto, model: nn.Module, model_name: str) -> str | None:
    """Raise GenerationError (one line) when ``graph``, the with-past ONNX at ``path`` read without its external
    weights, records another model's identity or vocabulary, or holds weights other than ``model``'s. Returns a
    warning line when neither its metadata nor its weights can tell, else None."""
    info = export_info(graph)
    if info.get("model_id") not in (None, fingerprint(model)):
        raise GenerationError(f"{path.name}: exported from another model than {model_name} (its recorded model "
                              "identity differs); pass the checkpoint it was exported from, or export this one")
    vocab = info.get("vocab_size")
    if vocab not in (None, model.config.vocab_size):
        raise GenerationError(f"{path.name}: exported from a model with vocabulary {vocab}, {model_name} has "
                              f"{model.config.vocab_size}; pass the checkpoint it was exported from")
    compared = _compare_weights(path, graph, model.state_dict(), model_name)
    if not compared and "model_id" not in info:
        return (f"{path.name}: cannot check that it was exported from {model_name} (it records no model identity "
                "and has no weight named like the model's); its tokens are right only if it was")
    return None


def _compare_weights(path: Path, graph: onnx.ModelProto, state: dict[str, torch.Tensor], model_name: str) -> int:
    """How many of the largest initializers named like a state_dict entry were compared with it; raises on the
    first that differs (in shape, or in a leading value beyond the rounding of its type)."""
    ops = OnnxRuntimeOps.of(graph)
    reordered = set(ops.reordered) if ops is not None else set()
    named = sorted((t for t in graph.graph.initializer
                    if t.name in state and t.name not in reordered and t.data_type in _STORED),
                   key=lambda t: -int(np.prod(t.dims, dtype=np.int64)))[:IDENTITY_TENSORS]
    compared = 0
    for tensor in named:
        ours = state[tensor.name]
        if list(tensor.dims) != list(ours.shape):
            raise GenerationError(f"{path.name}: exported from another model than {model_name} (its {tensor.name} is "
                                  f"{list(tensor.dims)}, the model's {list(ours.shape)}); pass the checkpoint it was "
                                  "exported from, or export this one")
        theirs = _leading_values(tensor, path.resolve().parent, IDENTITY_SAMPLES)
        if not theirs.size:
            continue
        compared += 1
        stored = _STORED[tensor.data_type][1]
        expected = ours.detach().reshape(-1)[:theirs.size].to(stored).to(torch.float64).numpy()
        if not np.allclose(theirs, expected, rtol=float(torch.finfo(stored).eps), atol=float(torch.finfo(stored).tiny)):
            raise GenerationError(f"{path.name}: exported from another model than {model_name} (its {tensor.name} "
                                  "holds other weights); pass the checkpoint it was exported from, or export this one")
    return compared


def _leading_values(tensor: onnx.TensorProto, folder: Path, count: int) -> np.ndarray:
    """The first ``count`` values of a float initializer as float64, reading no more of it (from its external file
    when it has one: ``graphs.load.load_onnx`` has checked the location lies inside the model's folder)."""
    layout = np.dtype(_STORED[tensor.data_type][0])
    count = min(count, int(np.prod(tensor.dims, dtype=np.int64)))
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        where = {entry.key: entry.value for entry in tensor.external_data}
        with open(folder / where["location"], "rb") as stream:
            stream.seek(int(where.get("offset", 0)))
            raw = stream.read(count * layout.itemsize)
    elif tensor.raw_data:
        raw = tensor.raw_data[:count * layout.itemsize]
    else:
        return numpy_helper.to_array(tensor).reshape(-1)[:count].astype(np.float64)
    values = np.frombuffer(raw[:len(raw) - len(raw) % layout.itemsize], layout)
    if tensor.data_type == onnx.TensorProto.BFLOAT16:
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float64)
