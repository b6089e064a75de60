"""With-past export of any model whose ``with_past()`` gives a ``WithPastModel`` (models/base.py, docs/decode.md):
one graph for prefill (past length 0) and decode.

Inputs ``input_ids``, ``attention_mask``, ``position_ids`` and the model's cache inputs (``past_key_values.{i}.key`` /
``.value`` for a KV cache); outputs ``logits`` and the presents (``present.{i}.key`` / ``.value``). Dynamic dims
``batch``, ``seq`` (new tokens), ``past`` and ``total`` (= past + seq, the attention mask's length). torch.export
specialises sizes 0 and 1, so the graph is traced at a past length of at least 2 with ``Dim("past", min=0)``
(docs/exporter-notes.md).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch

from attnres_export.dims import DimRange
from attnres_export.dtypes import torch_dtype
from attnres_export.errors import ExportError
from attnres_export.exporter.assemble import export_planned, plan_of
from attnres_export.exporter.to_onnx import quiet_torch_onnx_export, translation_table
from attnres_export.graphs.schemas import register_schemas
from attnres_export.models.base import WithPastModel, step_input_axes, step_output_names
from attnres_export.models.checkpoint import model_as

DIM_NAMES = ("batch", "seq", "past", "total")


def with_past_ranges(batch: DimRange, seq: DimRange | None, past: DimRange | None, max_seq_len: int
                     ) -> dict[str, DimRange]:
    """Ranges of the four dims; ``total`` (past + seq) never exceeds ``max_seq_len`` (rotary table rows)."""
    seq = seq or DimRange(1, 1, max_seq_len)
    past = past or DimRange(0, min(63, max_seq_len - 1), max_seq_len - 1)
    if seq.max > max_seq_len:
        raise ExportError(f"--seq max {seq.max} exceeds the model's max_seq_len {max_seq_len}; lower it")
    if past.max + seq.min > max_seq_len:
        raise ExportError(f"--past max {past.max} plus --seq min {seq.min} exceeds the model's max_seq_len "
                          f"{max_seq_len} (positions index the rotary table); lower --past")
    total = DimRange(past.min + seq.min, min(past.opt + seq.opt, max_seq_len), min(past.max + seq.max, max_seq_len))
    return {"batch": batch, "seq": seq, "past": past, "total": total}


def _trace(rng: DimRange) -> int:
    """A traced size of at least 2 (torch.export specialises 0 and 1) inside the range when it can be."""
    if rng.min == rng.max:
        return rng.min
    return min(max(rng.opt, 2), rng.max)


def export_with_past(model: torch.nn.Module, ranges: dict[str, DimRange], dtype: str, opset: int, seed: int,
                     fuse_norm: bool = False, trace_whole: bool = False,
                     status: Callable[[str], None] = lambda _: None,
                     read: Callable[[torch.Tensor], torch.Tensor] | None = None,
                     stored: Callable[[torch.Tensor], object | None] | None = None,
                     trace_cache: Path | None = None) -> tuple[ir.Model, WithPastModel]:
    """The ONNX model of the with-past form of ``model`` in ``dtype`` (score weights folded, and aggregations fused
    with their norms when ``fuse_norm``; a copy only when the weights are stored in another type), assembled from
    the model's export plan or, without one or with ``trace_whole``, traced whole; and the with-past form of
    ``model`` itself (the reference). ``read`` gives the values of a tensor ``model`` holds on the meta device (a
    streamed model, ``models.store``; ``stored``: the stored tensor it reads): only an assembled export can take such a
    model, and only an assembled export reads its trace from the ``trace_cache`` folder."""
    reference = model.with_past()
    if reference is None:
        raise ExportError(f"--with-past: {model.config.arch} models have no KV cache; drop --with-past")
    register_schemas()
    export_model = model_as(model, dtype)
    wrapper = export_model.with_past()
    cache = wrapper.cache_inputs()
    cfg = model.config
    b, t, p = (_trace(ranges[name]) for name in ("batch", "seq", "past"))
    p = max(min(p, cfg.max_seq_len - t), ranges["past"].min)
    plan = None if trace_whole else plan_of(export_model, with_past=True, fuse_norm=fuse_norm)
    if plan is not None:
        sizes = {"batch": b, "seq": t, "past": p, "total": p + t}
        return (export_planned(export_model, plan, ranges, sizes, dtype, opset, status, read, stored, trace_cache),
                reference)
    status(f"tracing the whole with-past model ({dtype}, opset {opset})")
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(b, t), dtype=np.int64))
    mask = torch.ones(b, p + t, dtype=torch.int64)
    positions = (torch.arange(t, dtype=torch.int64) + p)[None].expand(b, t).contiguous()
    past = [_traced_state(c, b, p, torch_dtype(dtype)) for c in cache]
    dims = {name: _dim(name, ranges[name]) for name in DIM_NAMES}
    dynamic_shapes = {
        "input_ids": {0: dims["batch"], 1: dims["seq"]},
        "attention_mask": {0: dims["batch"], 1: dims["total"]},
        "position_ids": {0: dims["batch"], 1: dims["seq"]},
        "past": [{axis: dims[label] for axis, label in enumerate(c.axes) if isinstance(label, str)} for c in cache],
    }
    with export_model.score_weights_folded(), export_model.norms_fused() if fuse_norm else nullcontext():
        program = quiet_torch_onnx_export(
            wrapper, (ids, mask, positions, past), custom_translation_table=translation_table(),
            dynamic_shapes=dynamic_shapes, input_names=list(step_input_axes(cache)),
            output_names=step_output_names(cache), opset_version=opset,
        )
    return program.model, reference


def _traced_state(cache, batch: int, past: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero state of the traced sizes (``past`` positions where the state has a past axis)."""
    held = dtype if cache.dtype == "model" else getattr(torch, cache.dtype)
    shape = [batch if a == "batch" else past if a == "past" else a for a in cache.axes]
    return torch.zeros(shape, dtype=held)


def dynamic_dims_with_past(axes: dict[str, list[str | int]], ranges: dict[str, DimRange]
                           ) -> dict[str, dict[int, tuple[str, DimRange]]]:
    """Per graph input, its dynamic axes and their names (for ``name_dynamic_dims``)."""
    return {name: {a: (label, ranges[label]) for a, label in enumerate(labels) if isinstance(label, str)}
            for name, labels in axes.items()}


def _dim(name: str, rng: DimRange):
    return None if rng.min == rng.max else torch.export.Dim(name, min=rng.min, max=rng.max)
