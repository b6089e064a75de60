"""The routing-aware comparison of a mixture-of-experts ONNX artifact (docs/parity.md#routing-aware-comparison).

A 16-bit artifact can break a near-tie between two experts the other way than float64 does; the token then runs
other experts, and every later layer (and every later token, through attention) inherits the difference, so one
flipped choice can move the logits far beyond the dtype's bar although every operation is right. This check
judges the arithmetic and the choices separately:

1. the artifact runs with every router's chosen experts as extra outputs (an in-memory copy of its graph: the
   indices of the last ``TopK`` of each ``model.layers.{i}.mlp`` scope, in layer order);
2. the float64 PyTorch model reruns with exactly those choices (``models/routing.py``), and the artifact's
   outputs are judged against that run at the usual bars (scaled by PyTorch's own error: float32's, and a 16-bit
   artifact's type's, each run with the plain float64 run's choices);
3. every choice that is not that float64 run's own top-k (a *flip*) must be a tie at the artifact's precision:
   the chosen expert's float64 score is below the k-th best by at most the dtype's relative L2 bar, relative to
   the k-th best expert's score before any correction bias (``TIE_FACTOR`` times the bar). A wrong router (a wrong
   expert, a wrong bias) makes large regrets and fails here even when the rest agrees.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from attnres_export.atomic import scratch_file_beside
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.backends.pytorch.runner import TorchRunner
from attnres_export.dtypes import Tolerance
from attnres_export.errors import ParityError
from attnres_export.graphs.external_data import external_locations
from attnres_export.graphs.load import load_onnx
from attnres_export.models.routing import RoutingTrace, traced_routing
from attnres_export.parity.metrics import ErrorMetrics, compare, compare_scaled
from attnres_export.parity.report import Check, Report
from attnres_export.parity.types import Feeds, References, Shape

TIE_FACTOR = 1.0
"""A flip is a tie when the chosen expert's float64 score is within ``TIE_FACTOR * rel_l2 bar`` of the k-th best,
relative to the k-th best's unbiased score: the same relative error the artifact may make on any output."""
CHOICE_PREFIX = "routing_choice."
_ROUTER_SCOPE = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp$")


@dataclass(frozen=True)
class RoutingCheck:
    """One shape of the comparison."""

    shape: list[int]
    metrics: dict[str, ErrorMetrics]
    """Each output against the float64 run forced to the artifact's choices."""
    unforced_rel_l2: dict[str, float]
    """Each output's relative L2 against the plain float64 run (what the ordinary check judges)."""
    choices: int
    """(token, router call) pairs."""
    flips: int
    """Choices that are not the forced float64 run's own top-k."""
    differ_from_float64: int
    """Choices that differ from the plain float64 run's (flips and the changes they cause downstream)."""
    max_relative_regret: float
    """Largest (k-th best - chosen) / k-th best's unbiased float64 score over the flips (0 without flips)."""
    tie_bar: float

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.metrics.values()) and self.max_relative_regret <= self.tie_bar

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "metrics": {k: v.to_dict() for k, v in self.metrics.items()}}


def router_choice_outputs(model: onnx.ModelProto) -> list[str]:
    """The expert indices of every router in the graph, in layer order: the second output of the last ``TopK`` of
    each ``...layers.{i}.mlp`` node scope (group-limited routers have earlier ``TopK`` nodes for the groups)."""
    last: dict[int, str] = {}
    for node in model.graph.node:
        if node.op_type != "TopK" or "/" not in node.name:
            continue
        match = _ROUTER_SCOPE.search(node.name.rsplit("/", 1)[0])
        if match:
            last[int(match[1])] = node.output[1]
    return [last[layer] for layer in sorted(last)]


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model``'s graph that also returns ``names`` (int64 values), as ``CHOICE_PREFIX`` + index."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for index, name in enumerate(names):
        copy.graph.node.append(onnx.helper.make_node("Identity", [name], [f"{CHOICE_PREFIX}{index}"]))
        copy.graph.output.append(onnx.helper.make_tensor_value_info(f"{CHOICE_PREFIX}{index}", onnx.TensorProto.INT64,
                                                                    None))
    return copy


@contextmanager
def choice_runner(path: Path) -> Iterator[tuple[OnnxRuntimeRunner, int]]:
    """An activated ONNX Runtime runner on ``path``'s graph with its routers' choices as extra outputs, and how
    many routers it has. A graph with external weights is written beside them under a private name."""
    path = Path(path)
    graph = load_onnx(path, load_external_data=False)
    names = router_choice_outputs(graph)
    if not names:
        raise ParityError(f"{path.name} has no router (no TopK under a layers.N.mlp scope): the routing-aware "
                          "comparison is for mixture-of-experts exports")
    if external_locations(graph):
        with scratch_file_beside(path, ".routing.onnx") as sidecar:
            onnx.save_model(with_outputs(graph, names), str(sidecar))
            runner = OnnxRuntimeRunner(sidecar, artifact=path.name)
            runner.activate()
    else:
        runner = OnnxRuntimeRunner(with_outputs(load_onnx(path), names), artifact=path.name)
        runner.activate()
    try:
        yield runner, len(names)
    finally:
        runner.deactivate()


def run_routed(model: nn.Module, feeds: dict[str, np.ndarray], dtype: str,
               forced: Sequence[torch.Tensor] | None = None) -> tuple[dict[str, np.ndarray], RoutingTrace]:
    """``model`` computing in ``dtype`` on ``feeds``, its routers traced (and forced)."""
    with traced_routing(forced) as trace:
        outputs = TorchRunner(model, list(model.output_names), dtype=dtype).infer(feeds)
    return outputs, trace


def flip_regrets(trace: RoutingTrace) -> tuple[int, int, float]:
    """(choices, flips, largest relative regret) of a forced trace: per router call and token, whether the chosen
    set is the call's own top-k, and by how much the weakest chosen expert trails the k-th best, relative to the
    k-th best expert's unbiased score. The gap is of the scores the router chooses by (biased, group-masked); the
    scale is not, so a constant added to every correction bias, which changes no choice, changes no regret either
    (relative to the biased score, a bias of 1e6 would make every flip a tie)."""
    choices = flips = 0
    worst = 0.0
    for scores, unbiased, chosen in zip(trace.scores, trace.unbiased, trace.chosen, strict=True):
        k = chosen.shape[1]
        best = scores.topk(k, dim=-1)
        kth = best.values[:, -1]
        scale = unbiased.gather(1, best.indices[:, -1:]).squeeze(1).abs()
        weakest = scores.gather(1, chosen).min(dim=-1).values
        regret = (kth - weakest) / scale.clamp_min(torch.finfo(scores.dtype).tiny)
        own = best.indices.sort(dim=-1).values
        flipped = (own != chosen.sort(dim=-1).values).any(dim=-1)
        choices += flipped.numel()
        flips += int(flipped.sum())
        if bool(flipped.any()):
            worst = max(worst, float(regret[flipped].max()))
    return choices, flips, worst


def artifact_runs(artifact: Path, feeds: dict[Shape, Feeds]) -> tuple[dict[Shape, Feeds], dict[Shape, list]]:
    """Step 1, without the model: ``artifact``'s outputs and its routers' choices (``[tokens, k]`` each, in layer
    order) on the feeds of every shape. The ONNX Runtime session is closed before the model is needed."""
    outputs, choices = {}, {}
    with choice_runner(Path(artifact)) as (runner, routers):
        for shape, shape_feeds in feeds.items():
            got = runner.infer(shape_feeds)
            choices[shape] = [torch.from_numpy(got.pop(f"{CHOICE_PREFIX}{i}")) for i in range(routers)]
            outputs[shape] = got
    return outputs, choices


def routing_aware_checks(model: nn.Module, artifact: str, dtype: str, tolerance: Tolerance, references: References,
                         outputs: dict[Shape, Feeds], choices: dict[Shape, list]) -> list[RoutingCheck]:
    """Step 2: judge the ``dtype`` artifact's ``outputs`` against ``model`` in float64 forced to its ``choices``,
    at ``tolerance`` scaled by PyTorch's own error (float32's, and for a 16-bit artifact that of PyTorch in its
    type, from ``references``), and its flips against the tie bar. The plain float64 run, its choices and the
    float32 and 16-bit runs with those choices come from ``references`` (parity/session.py: ``reference_outputs``
    ran them on the same feeds)."""
    checks = []
    for shape, shape_feeds in references.feeds.items():
        exact, own_choices, float32 = references.exact[shape], references.choices[shape], references.expected[shape]
        same_type = references.same_type.get(dtype, {}).get(shape)
        routed, trace = run_routed(model, shape_feeds, "float64", choices[shape])
        if len(trace.chosen) != len(choices[shape]):
            raise ParityError(f"{artifact} has {len(choices[shape])} routers, but its model routed {len(trace.chosen)} "
                              "times: it was exported from another model")
        total, flips, regret = flip_regrets(trace)
        differ = sum(int((a.sort(-1).values != b.sort(-1).values).any(-1).sum())
                     for a, b in zip(trace.chosen, own_choices, strict=True))
        loose = Tolerance(float("inf"), -1.0)
        got = outputs[shape]
        metrics = {name: compare_scaled(got[name], routed[name], tolerance, compare(float32[name], exact[name], loose),
                                        None if same_type is None else compare(same_type[name], exact[name], loose))
                   for name in model.output_names}
        unforced = {name: compare(got[name], exact[name], loose).rel_l2 for name in model.output_names}
        checks.append(RoutingCheck(list(shape), metrics, unforced, total, flips, differ, regret,
                                   TIE_FACTOR * tolerance.rel_l2))
    return checks


def with_artifact_routing(report: Report, artifact: Path, artifact_name: str, references: References,
                          reference_model: Callable[[], nn.Module], tolerance: Tolerance,
                          status: Callable[[str], None] = lambda _: None) -> Report:
    """``report`` itself when ``artifact_name``'s rows passed, or when ``artifact`` is no plain graph with routers
    judged against float64; otherwise the report with those rows judged by the routing-aware comparison instead
    (its plain rows and the flips go to the JSON under ``routing_aware``). ``reference_model`` (the model as
    stored) is called after ONNX Runtime has closed the artifact."""
    plain = [check for check in report.checks if check.artifact == artifact_name]
    if all(check.ok for check in plain) or references.exact is None:
        return report
    if not router_choice_outputs(load_onnx(Path(artifact), load_external_data=False)):
        return report
    status("routing-aware comparison: the artifact's own expert choices")
    outputs, choices = artifact_runs(Path(artifact), references.feeds)
    status("routing-aware comparison: PyTorch float64 with those choices")
    checks = routing_aware_checks(reference_model(), artifact_name, plain[0].dtype, tolerance, references, outputs,
                                  choices)
    rows = [Check(check.shape, f"{plain[0].backend}+artifact-routing", artifact_name, plain[0].dtype,
                  {**check.metrics, choices_row(check): _regret_metrics(check)}) for check in checks]
    for check in checks:
        status(f"routing-aware comparison at {'x'.join(map(str, check.shape))}: {check.flips} of {check.choices} "
               f"expert choices break a float64 near-tie the other way (largest regret {check.max_relative_regret:.3g}"
               f" of the k-th score, tie bar {check.tie_bar:g}); {check.differ_from_float64} differ from float64's "
               f"own; logits rel L2 {check.unforced_rel_l2.get('logits', float('nan')):.3g} against the plain "
               "float64 run")
    judged = Report([c for c in report.checks if c.artifact != artifact_name] + rows, dict(report.extra))
    judged.extra["routing_aware"] = {"artifact": artifact_name, "checks": [c.to_dict() for c in checks],
                                     "plain_checks": [c.to_dict() for c in plain]}
    return judged


def choices_row(check: RoutingCheck) -> str:
    """The name of the row that judges the flips (its relative L2 column is the largest relative regret, its bar
    the tie bar), with how many of the choices flipped."""
    return f"expert-choices ({check.flips}/{check.choices} flipped)"


def _regret_metrics(check: RoutingCheck) -> ErrorMetrics:
    regret = check.max_relative_regret
    return ErrorMetrics(regret, regret, regret, 1.0, regret <= check.tie_bar, rel_l2_bar=check.tie_bar,
                        cosine_bar=1.0)
