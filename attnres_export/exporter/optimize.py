"""The graph clean-up after ``torch.onnx.export``: onnxscript's optimizer minus its pattern-rewrite rules.

``torch.onnx.export(optimize=True)`` runs onnxscript's default rewrite rules, and one of them, the no-op rule
``x + 0 -> x`` (onnxscript 0.7.2, ``rewriter/rules/common/_no_op.py``), matches a scalar constant with
``math.isclose(c, 0, abs_tol=1e-8)``: ``x + 1e-8`` (an RMSNorm's eps) is rewritten to ``x``, and a source that is
all zeros then divides by zero (docs/exporter-notes.md). ``x * 1`` and ``x / 1`` match within a relative 1e-5 the
same way. So the export runs with ``optimize=False`` and this module applies the passes that change no value:
inlining, constant folding, dead-node removal, constants lifted to initializers, deduplication and common
subexpression elimination.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.optimizer import fold_constants_ir


class _FoldConstants(ir.passes.InPlacePass):
    """onnxscript's constant folding (with node-level shape inference) as a pass."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = fold_constants_ir(model, onnx_shape_inference=True)
        return ir.passes.PassResult(model, modified=result.modified)


def optimize_exported(model: ir.Model) -> None:
    """Clean ``model`` up in place without any rewrite that can change a value."""
    ir.passes.Sequential(
        common_passes.InlinePass(),
        ir.passes.PassManager([_FoldConstants(), common_passes.RemoveUnusedNodesPass(),
                               common_passes.RemoveUnusedFunctionsPass(), common_passes.RemoveUnusedOpsetsPass()],
                              steps=2, early_stop=True),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )(model)
