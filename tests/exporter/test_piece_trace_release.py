"""Tracing a model's pieces keeps none of its weights alive. After a trace with a ``torch.cond`` (a mixture of
experts) torch.export's tracer outlives the trace and holds the module it traced, so a weight reachable from it
would stay resident (with the whole memory map of a stored checkpoint) through the export's parity check
(docs/benchmarks.md, "CPU: export memory")."""

from __future__ import annotations

import gc
import weakref

from attnres_export.exporter.assemble import plan_of
from attnres_export.exporter.piece_trace import trace_kinds
from attnres_export.models import load_checkpoint
from attnres_export.models.decoder.example import write_example_folder
from tests.exporter.assembled_compare import RANGES


def weights_of(model) -> list[weakref.ref]:
    return [weakref.ref(t) for t in [*model.parameters(), *model.buffers()]]


def test_tracing_the_pieces_of_an_moe_leaves_none_of_the_models_weights_alive(tmp_path):
    model, _ = load_checkpoint(write_example_folder("qwen3_moe", tmp_path / "moe", seed=3)[0])
    plan = plan_of(model, with_past=False, fuse_norm=False)
    traced = trace_kinds(plan.pieces(), RANGES, {"batch": 2, "seq": 5}, "float32", 18)
    weights = weights_of(model)
    del model, plan
    gc.collect()
    assert traced and [w() for w in weights if w() is not None] == []
