"""The rounding-aware comparison of an ONNX artifact whose ``MatMulNBits`` quantize their activations to int8
(``--int8-activations``; docs/parity.md#rounding-aware-comparison).

Rounding an activation to int8 is discontinuous. A value the artifact computes a hair away from PyTorch (float32
arithmetic in another order) rounds to the other neighbour when it sits at a half step; that block's contribution
moves by a whole step (1/127 of its largest value), and every later layer inherits it: on an 8-layer model at
width 512, a few such ties move the logits by 1e-3 to 1e-2 although every operation is right. As the
routing-aware comparison does for expert choices (parity/routing.py), this judges the arithmetic and the
roundings separately:

1. the artifact runs with the input of every ``MatMulNBits`` (and its routers' choices, if it has routers) as
   extra outputs (an in-memory copy of its graph, or one written beside its external weights);
2. the float64 model reruns with those choices and, in each quantizing ``Linear``, the artifact's int8 value
   wherever the two differ by one step and float64's unrounded value lies within ``tie_steps`` of the half step
   between them (``parity/int8_activations.py``): ``TIE_FACTOR`` x the dtype's relative L2 bar x 127 steps, the
   error the bar allows the artifact on a value relative to its block's largest. Any other difference is left as
   float64 rounds it, so a wrong activation still fails;
3. the artifact's outputs are judged against that run at the dtype's own bars, and the report counts the values
   taken from the artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path

import onnx
import torch
from torch import nn

from attnres_export.atomic import scratch_file_beside
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.backends.pytorch.runner import TorchRunner
from attnres_export.dtypes import Tolerance
from attnres_export.graphs.external_data import external_locations
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.metadata import INT8_ACTIVATIONS_KEY, export_info
from attnres_export.models.base import WithPastFeeds, step_output_names
from attnres_export.models.routing import traced_routing
from attnres_export.parity.int8_activations import INT8_MAX, forced_roundings
from attnres_export.parity.metrics import compare
from attnres_export.parity.report import Check, Report
from attnres_export.parity.routing import CHOICE_PREFIX, router_choice_outputs
from attnres_export.parity.types import Feeds, References, Shape

TIE_FACTOR = 1.0
INPUT_PREFIX = "int8_input."


def matmul_inputs(model: onnx.ModelProto) -> dict[str, str]:
    """The graph value each int8-activation weight's ``MatMulNBits`` reads as its input, by state_dict name (from the
    export's ``int8_activations`` record); weights whose node is inside a subgraph are left out."""
    written = export_info(model).get(INT8_ACTIVATIONS_KEY) or {}
    by_packed: dict[str, list[str]] = {}
    for name, entry in written.items():  # one node may multiply several weights (sibling_matmul_nbits)
        by_packed.setdefault(entry["packed"], []).append(name)
    return {name: node.input[0] for node in model.graph.node
            if node.op_type == "MatMulNBits" and len(node.input) > 1
            for name in by_packed.get(node.input[1], [])}


def with_probes(model: onnx.ModelProto, inputs: Mapping[str, str], choices: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns each ``MatMulNBits`` input (float) and each router's choice (int64)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    probes = [(f"{INPUT_PREFIX}{name}", value, onnx.TensorProto.FLOAT) for name, value in inputs.items()]
    probes += [(f"{CHOICE_PREFIX}{i}", value, onnx.TensorProto.INT64) for i, value in enumerate(choices)]
    for output, value, dtype in probes:
        copy.graph.node.append(onnx.helper.make_node("Identity", [value], [output]))
        copy.graph.output.append(onnx.helper.make_tensor_value_info(output, dtype, None))
    return copy


@contextmanager
def probe_runner(path: Path) -> Iterator[tuple[OnnxRuntimeRunner, int]]:
    """An activated ONNX Runtime runner on ``path``'s graph with the probes of ``with_probes``, and its router count."""
    graph = load_onnx(path, load_external_data=False)
    inputs, choices = matmul_inputs(graph), router_choice_outputs(graph)
    if external_locations(graph):
        with scratch_file_beside(path, ".rounding.onnx") as sidecar:
            onnx.save_model(with_probes(graph, inputs, choices), str(sidecar))
            runner = OnnxRuntimeRunner(sidecar, artifact=path.name)
            runner.activate()
    else:
        runner = OnnxRuntimeRunner(with_probes(load_onnx(path), inputs, choices), artifact=path.name)
        runner.activate()
    try:
        yield runner, len(choices)
    finally:
        runner.deactivate()


def _probed(path: Path, feeds: dict[Shape, Feeds]) -> tuple[dict, dict, dict]:
    """The artifact's outputs, ``MatMulNBits`` inputs and router choices at every shape (the session is closed
    before the model is needed)."""
    outputs, inputs, choices = {}, {}, {}
    with probe_runner(path) as (runner, routers):
        for shape, shape_feeds in feeds.items():
            got = runner.infer(shape_feeds)
            choices[shape] = [torch.from_numpy(got.pop(f"{CHOICE_PREFIX}{i}")) for i in range(routers)] or None
            inputs[shape] = {key.removeprefix(INPUT_PREFIX): got.pop(key) for key in list(got)
                             if key.startswith(INPUT_PREFIX)}
            outputs[shape] = got
    return outputs, inputs, choices


def _float64_runner(model: nn.Module, with_past: bool) -> TorchRunner:
    if with_past:
        wrapper = model.with_past()
        return TorchRunner(WithPastFeeds(wrapper), step_output_names(wrapper.cache_inputs()), dtype="float64")
    return TorchRunner(model, list(model.output_names), dtype="float64")


def with_artifact_rounding(report: Report, artifact: Path, artifact_name: str, references: References,
                           reference_model: Callable[[], nn.Module], tolerance: Tolerance, with_past: bool,
                           status: Callable[[str], None] = lambda _: None) -> Report:
    """``report`` itself when ``artifact`` has no int8 activations; otherwise the report with ``artifact_name``'s rows
    judged by the rounding-aware comparison, whether they passed or not: the plain rows' bars scale with float32
    PyTorch's own error, which a tie float32 rounds the other way makes as large as a wrong rounding would (the
    plain rows and the counts go to the JSON under ``rounding_aware``). ``reference_model`` (with its int8
    activations) is called after ONNX Runtime has closed the artifact."""
    plain = [check for check in report.checks if check.artifact == artifact_name]
    if not plain or not matmul_inputs(load_onnx(Path(artifact), load_external_data=False)):
        return report
    status("rounding-aware comparison: the artifact's own int8 activations")
    outputs, inputs, choices = _probed(Path(artifact), references.feeds)
    status("rounding-aware comparison: PyTorch float64 with its roundings at ties")
    runner = _float64_runner(reference_model(), with_past)
    tie_steps = TIE_FACTOR * tolerance.rel_l2 * INT8_MAX
    rows, counts = [], []
    for shape, shape_feeds in references.feeds.items():
        routed = traced_routing(choices[shape]) if choices[shape] else nullcontext()
        with forced_roundings(inputs[shape], tie_steps) as roundings, routed:
            expected = runner.infer(shape_feeds)
        got = outputs[shape]
        rows.append(Check(list(shape), f"{plain[0].backend}+artifact-rounding", artifact_name, plain[0].dtype,
                          {name: compare(got[name], expected[name], tolerance) for name in runner.output_names}))
        counts.append({"shape": list(shape), "values": roundings.values, "taken_at_ties": roundings.adopted,
                       "differ_without_tie": roundings.disagreements, "tie_steps": tie_steps})
        status(f"rounding-aware comparison at {'x'.join(map(str, shape))}: {roundings.adopted} of "
               f"{roundings.values:,} int8 activations round the other way at a tie (within {tie_steps:.3g} of a "
               f"half step); {roundings.disagreements} differ without a tie")
    judged = Report([c for c in report.checks if c.artifact != artifact_name] + rows, dict(report.extra))
    judged.extra["rounding_aware"] = {"artifact": artifact_name, "roundings": counts,
                                      "plain_checks": [c.to_dict() for c in plain]}
    return judged

