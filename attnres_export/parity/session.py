"""One model's parity check (docs/parity.md): the three steps every check of an attnres checkpoint's artifacts runs,
whoever asks for it (``attnres check`` and ``attnres_export.api.check`` through ``parity/check.py:
check_artifacts``, the check ``attnres-export`` runs on the file it stages and its ``--genai`` check through
``check_onnx``):

1. ``CheckSession.references``: the PyTorch outputs (float32, and float64 and each 16-bit artifact type where the
   bar scales) on the feeds of every shape (``reference_outputs``);
2. ``CheckSession.judge``: every artifact on the same feeds, each output judged (``judge_artifacts``);
3. within ``judge``, the routing-aware comparison of each ONNX graph with routers that missed its bar
   (``parity/routing.py``, docs/parity.md#routing-aware-comparison).

The session gets the model from a provider (``reference_model``: the model as stored), which the caller backs with
one opened checkpoint (``models.store.open_checkpoint(path).model(None)``): the checkpoint is opened once per
command, and the routing-aware comparison asks the same provider instead of opening the file again. The session
holds no model between the steps: the one the references ran on is released before any ONNX Runtime session opens,
so that the model and ONNX Runtime's copy of the weights are never resident together (docs/benchmarks.md, "CPU:
export memory")."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from pathlib import Path

from torch import nn

from attnres_export.backends.base import Runner
from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.dtypes import HALF_PRECISION, Tolerance
from attnres_export.models.routing import traced_routing
from attnres_export.parity.feeds import Subject, checkpoint_subject
from attnres_export.parity.report import Report, run_checks, run_reference
from attnres_export.parity.rounding import with_artifact_rounding
from attnres_export.parity.routing import with_artifact_routing
from attnres_export.parity.types import ArtifactRun, Feeds, References, Shape, Status


def _quiet(_: str) -> None:
    pass


class CheckSession:
    """The check of artifacts of one model, whose PyTorch form ``reference_model`` returns (weights as stored; the
    runners cast them as they read them). ``seed`` picks the feeds; ``status`` hears each step."""

    def __init__(self, reference_model: Callable[[], nn.Module], seed: int = 0, status: Status = _quiet) -> None:
        self.reference_model = reference_model
        self.seed = seed
        self.status = status
        self.with_past = False
        """Whether the references (and so the artifacts) are of the with-past graph: set by ``references``."""

    def references(self, shapes: Sequence[Shape], with_past: bool, dtypes: Sequence[str]) -> dict[str | None,
                                                                                                  References]:
        """Step 1, for artifacts of ``dtypes``: the references of a plain graph under the key None; of a with-past
        graph, one per dtype (its past is fed in that dtype). The model is asked for once and released (with a full
        collection) before this returns."""
        self.with_past = with_past
        model = self.reference_model()
        by_feeds: dict[str | None, References] = {}
        for dtype in dtypes:
            key = dtype if with_past else None
            if key not in by_feeds:
                by_feeds[key] = reference_outputs(checkpoint_subject(model, with_past, dtype, self.seed), shapes,
                                                  self.status, dtypes)
        del model
        collect_all_garbage()
        return by_feeds

    def judge(self, runs: Sequence[ArtifactRun]) -> Report:
        """Steps 2 and 3: every artifact judged on its references, then each ONNX graph (``ArtifactRun.routing``)
        whose rows missed their bar judged by the routing-aware comparison, which asks ``reference_model`` for the
        model after ONNX Runtime has closed the graph."""
        report = judge_artifacts(runs, self.status)
        for run in runs:
            if run.routing is not None:
                path, name = run.routing
                report = with_artifact_routing(report, path, name, run.references, self.reference_model,
                                               run.tolerance, self.status)
                report = with_artifact_rounding(report, path, name, run.references, self.reference_model,
                                                run.tolerance, self.with_past, self.status)
        return report


def check_onnx(path: Path, artifact_name: str, reference_model: Callable[[], nn.Module], with_past: bool, dtype: str,
               seed: int, shapes: Sequence[Shape], tolerance: Tolerance, status: Status = _quiet) -> Report:
    """The check ``attnres-export`` runs on the ONNX file it wrote (``path``, its rows named ``artifact_name``): the
    references of ``reference_model`` (its plain graph, or with ``with_past`` its KV-cache graph fed a past in
    ``dtype``) at ``shapes``, the file on ONNX Runtime CPU judged at ``tolerance`` (scaled when float64 ran,
    docs/parity.md#pass-bars), and the routing-aware comparison where it applies. Every status line is prefixed
    with ``parity: ``. The model is released before ONNX Runtime opens the file."""
    session = CheckSession(reference_model, seed, lambda what: status(f"parity: {what}"))
    references = session.references(shapes, with_past, [dtype])[dtype if with_past else None]
    run = ArtifactRun(lambda: OnnxRuntimeRunner(path, artifact=artifact_name), dtype, tolerance, references,
                      routing=(Path(path), artifact_name))
    return session.judge([run])


def collect_all_garbage() -> None:
    """A full collection, of objects the caller froze too (``exporter/collection.py: collecting_new_objects_only``
    freezes everything alive when an export starts, the reference model's modules among them): what
    the export's own check needs before ONNX Runtime opens its file; for callers with and without frozen objects."""
    if not gc.get_freeze_count():
        gc.collect()
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def reference_outputs(subject: Subject, shapes: Sequence[Shape], status: Status = _quiet,
                      dtypes: Sequence[str] = ()) -> References:
    """Step 1: the PyTorch outputs (float32, and float64 when the subject has it) at every shape, with the feeds;
    with float64, also PyTorch computing in each 16-bit type of ``dtypes`` (the artifacts' types). With float64,
    float32 and the 16-bit types run with float64's expert choices: their error scales the bars, and a near-tie
    they break the other way would widen a bar by a flip instead of by their arithmetic (docs/parity.md#pass-bars)."""
    status("PyTorch references")
    feeds = {shape: subject.feeds(shape) for shape in shapes}
    if subject.precise is None:
        return References(list(shapes), feeds, run_reference(subject.reference, shapes, feeds.__getitem__), None)
    exact, choices = _routed_outputs(subject.precise, feeds)
    expected = _routed_outputs(subject.reference, feeds, choices)[0]
    same_type = {}
    for dtype in dict.fromkeys(d for d in dtypes if d in HALF_PRECISION):
        if subject.in_type is not None:
            status(f"PyTorch in {dtype}")
            same_type[dtype] = _routed_outputs(subject.in_type(dtype), feeds, choices)[0]
    return References(list(shapes), feeds, expected, exact, choices, same_type)


def _routed_outputs(runner: Runner, feeds: dict[Shape, Feeds], forced: dict[Shape, list] | None = None
                    ) -> tuple[dict[Shape, Feeds], dict[Shape, list]]:
    """``runner``'s outputs at every shape and its routers' expert choices (``forced`` ones where given)."""
    outputs, choices = {}, {}
    with runner:
        for shape, shape_feeds in feeds.items():
            with traced_routing(None if forced is None else forced[shape]) as trace:
                outputs[shape] = runner.infer(shape_feeds)
            choices[shape] = trace.chosen
    return outputs, choices


def judge_artifacts(runs: Sequence[ArtifactRun], status: Status = _quiet) -> Report:
    """Step 2: every artifact on its references' feeds, each output judged against the float64 outputs at a bar
    that scales with float32 PyTorch's own error (or against float32 PyTorch at the fixed bar). Each runner is
    opened only for its own turn."""
    report = Report()
    for run in runs:
        references = run.references
        runner = run.open()
        report.checks += run_checks(None, [(runner, run.dtype, run.tolerance)], references.shapes,
                                    references.feeds.__getitem__, progress=status, expected=references.expected,
                                    exact=references.exact, same_type=references.same_type.get(run.dtype)).checks
        del runner
    return report
