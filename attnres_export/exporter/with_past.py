"""With-past (KV-cache) export of ``AttnResLM`` (docs/decode.md): one graph for prefill (past length 0) and decode.

Inputs ``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key`` / ``.value``; outputs
``logits`` and ``present.{i}.key`` / ``.value``. Dynamic dims ``batch``, ``seq`` (new tokens), ``past`` and
``total`` (= past + seq, the attention mask's length). torch.export specialises sizes 0 and 1, so the graph is
traced at a past length of at least 2 with ``Dim("past", min=0)`` (docs/exporter-notes.md).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import onnx_ir as ir
import torch

from attnres_export.dims import DimRange
from attnres_export.dtypes import torch_dtype
from attnres_export.errors import ExportError
from attnres_export.exporter.to_onnx import quiet_torch_onnx_export, translation_table
from attnres_export.graphs.schemas import register_schemas
from attnres_export.models.attnres_lm import AttnResLM, AttnResLMWithPast
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


def export_with_past(model: AttnResLM, ranges: dict[str, DimRange], dtype: str, opset: int, seed: int,
                     fuse_norm: bool = False) -> tuple[ir.Model, AttnResLMWithPast]:
    """Trace the with-past wrapper of ``model`` in ``dtype`` (score weights folded, and aggregations fused with
    their norms when ``fuse_norm``; a copy only when the weights are stored in another type) and return the ONNX
    model and the wrapper of ``model`` itself (the reference)."""
    if not isinstance(model, AttnResLM):
        raise ExportError(f"--with-past: only attnres-lm checkpoints have a KV cache, this is {type(model).__name__}")
    register_schemas()
    export_model = model_as(model, dtype)
    wrapper = AttnResLMWithPast(export_model)
    cfg = model.config
    b, t, p = (_trace(ranges[name]) for name in ("batch", "seq", "past"))
    p = max(min(p, cfg.max_seq_len - t), ranges["past"].min)
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(b, t), dtype=np.int64))
    mask = torch.ones(b, p + t, dtype=torch.int64)
    positions = (torch.arange(t, dtype=torch.int64) + p)[None].expand(b, t).contiguous()
    past = [torch.zeros(b, cfg.n_heads, p, cfg.head_dim, dtype=torch_dtype(dtype)) for _ in range(2 * cfg.n_layers)]
    dims = {name: _dim(name, ranges[name]) for name in DIM_NAMES}
    dynamic_shapes = {
        "input_ids": {0: dims["batch"], 1: dims["seq"]},
        "attention_mask": {0: dims["batch"], 1: dims["total"]},
        "position_ids": {0: dims["batch"], 1: dims["seq"]},
        "past": [{0: dims["batch"], 2: dims["past"]} for _ in past],
    }
    with export_model.score_weights_folded(), export_model.norms_fused() if fuse_norm else nullcontext():
        program = quiet_torch_onnx_export(
            wrapper, (ids, mask, positions, past), custom_translation_table=translation_table(),
            dynamic_shapes=dynamic_shapes, input_names=wrapper.input_names(), output_names=wrapper.output_names(),
            opset_version=opset,
        )
    return program.model, AttnResLMWithPast(model)


def dynamic_dims_with_past(reference: AttnResLMWithPast, ranges: dict[str, DimRange]
                           ) -> dict[str, dict[int, tuple[str, DimRange]]]:
    """Per graph input, its dynamic axes and their names (for ``name_dynamic_dims``)."""
    return {name: {a: (label, ranges[label]) for a, label in enumerate(labels) if isinstance(label, str)}
            for name, labels in reference.input_axes().items()}


def _dim(name: str, rng: DimRange):
    return None if rng.min == rng.max else torch.export.Dim(name, min=rng.min, max=rng.max)
