"""The one parity check of an attnres checkpoint's artifacts (docs/parity.md): ``attnres check``, the check
``attnres-export`` runs on the file it stages, and ``attnres_export.api.check`` all run it.

It has two steps, so that a caller can release the PyTorch model between them: ``reference_outputs`` runs the
PyTorch model (float32, and float64 and each 16-bit artifact type where the bar scales), ``judge_artifacts`` runs
every artifact on the same feeds and judges each output. The exporter computes its references before ONNX Runtime
opens the staged file and releases the model in between (docs/benchmarks.md, "CPU: export memory").
``check_artifacts`` is the whole check for files on disk: it reads what each artifact was exported for, refuses a
checkpoint that is not the one an artifact came from and shapes outside the exported ranges (one line each), picks
the shapes, and runs the two steps."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnres_export.backends.base import Runner
from attnres_export.dims import DimRange, check_shapes, check_shapes_with_past
from attnres_export.dtypes import HALF_PRECISION, Tolerance
from attnres_export.errors import ParityError
from attnres_export.models.routing import traced_routing
from attnres_export.parity.feeds import Subject, checkpoint_subject, has_past
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.report import Report, run_checks, run_reference
from attnres_export.parity.routing import with_artifact_routing

Shape = tuple[int, ...]
Feeds = dict[str, np.ndarray]
Status = Callable[[str], None]

PLAIN_DIMS = ("batch", "seq")
PAST_DIMS = ("batch", "seq", "past")
CONFIG_KEYS = ("arch", "vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "d_ff", "residual",
               "block_size", "max_seq_len")
"""What an export's metadata may record of the model it came from, compared with the checkpoint's where its
family's config has the key (a decoder-lm config has no ``residual``, a kimi-linear one no ``head_dim``)."""


@dataclass
class Artifact:
    """An exported file as the check sees it before running it."""

    path: Path
    dtype: str
    with_past: bool
    dims: dict[str, list[int]]
    """The exported ranges (``batch``, ``seq``, and ``past``/``total`` for with-past graphs); {} when unrecorded."""
    inputs: dict[str, list[str | int]]
    outputs: dict[str, list[str | int] | None]
    """Each output's axes (None: no shape declared; {}: outputs not declared, e.g. an engine)."""
    recorded: dict
    """The attnres-export metadata ({} for files written elsewhere)."""
    target: str | None
    """``tensorrt``, ``portable`` or ``ort-trt`` for an ONNX file; None for an engine."""
    open: Callable[[], Runner]
    """Makes the runner (an ONNX Runtime session or a TensorRT engine)."""
    plugin: Path | None = None
    """The plugin library an engine loads (for replays)."""

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class References:
    """The PyTorch side of a check: the feeds and outputs at every shape."""

    shapes: list[Shape]
    feeds: dict[Shape, Feeds]
    expected: dict[Shape, Feeds]
    """float32 PyTorch's outputs (with float64's expert choices where float64 ran)."""
    exact: dict[Shape, Feeds] | None
    """float64 PyTorch's outputs, the reference of the scaled bars (None: judged against float32 PyTorch)."""
    choices: dict[Shape, list] = field(default_factory=dict)
    """float64 PyTorch's own expert choices per shape (one ``[tokens, k]`` tensor per router call; none without
    float64 or routers): what the float32 and 16-bit runs are forced to, and what the routing-aware comparison
    starts from."""
    same_type: dict[str, dict[Shape, Feeds]] = field(default_factory=dict)
    """Per 16-bit type of the artifacts judged against float64: PyTorch's outputs computing in it, with float64's
    expert choices (its arithmetic, not its flips), whose error scales those artifacts' bars."""

    @property
    def judged_against(self) -> tuple[str, dict[Shape, Feeds]]:
        """The name and outputs every artifact is compared with."""
        return ("pytorch-float64", self.exact) if self.exact is not None else ("pytorch-float32", self.expected)


@dataclass
class ArtifactRun:
    """One artifact to judge: how to open it, its dtype (which picks the bar) and the references it is judged on."""

    open: Callable[[], Runner]
    dtype: str
    tolerance: Tolerance
    references: References


@dataclass
class CheckResult:
    report: Report
    artifacts: list[Artifact]
    references: list[References]
    """Per artifact, the references it was judged on (for a Polygraphy replay)."""
    shapes: list[Shape]


def reference_outputs(subject: Subject, shapes: Sequence[Shape], status: Status = lambda _: None,
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


def judge_artifacts(runs: Sequence[ArtifactRun], status: Status = lambda _: None) -> Report:
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


def default_shapes(dims: dict[str, list[int]], with_past: bool) -> list[Shape]:
    """The shapes a check runs when none are asked for, from recorded ranges: the optimum and the largest batch
    with the fewest tokens (with a past: a prefill and a decode step; ``dims.check_shapes_with_past``)."""
    wanted = (*PAST_DIMS, "total") if with_past else PLAIN_DIMS
    missing = [name for name in wanted if name not in dims]
    if missing:
        raise ParityError(f"no {'/'.join(missing)} range recorded in the artifacts; pass --shapes "
                          f"{'B,T,P' if with_past else 'B,T'}")
    ranges = {name: DimRange(*dims[name]) for name in wanted}
    return [tuple(s) for s in (check_shapes_with_past(ranges) if with_past else check_shapes(ranges))]


def refuse_shapes_outside(shapes: Sequence[Shape], artifacts: Sequence[Artifact], max_seq_len: int) -> None:
    """A shape outside a range an artifact was exported for, or longer than the model's max_seq_len, is refused
    in one line instead of failing inside a runtime."""
    for shape in shapes:
        spelled = ",".join(map(str, shape))
        sizes = dict(zip(PAST_DIMS, shape, strict=False))
        tokens = sizes["seq"] + sizes.get("past", 0)
        if tokens > max_seq_len:
            what = "T + P" if "past" in sizes else "T"
            raise ParityError(f"--shapes {spelled}: {what} is over the model's max_seq_len {max_seq_len}")
        if "past" in sizes:
            sizes["total"] = tokens
        for artifact in artifacts:
            for name, size in sizes.items():
                low, _, high = artifact.dims.get(name, (size, size, size))
                if not low <= size <= high:
                    option = "--past/--seq" if name == "total" else f"--{name}"
                    raise ParityError(f"--shapes {spelled}: {name} {size} is outside the range {low}..{high} "
                                      f"{artifact.name} was exported for; pick a shape inside it or re-export with "
                                      f"a wider {option}")


def choose_shapes(artifacts: Sequence[Artifact], wanted: Sequence[Shape], max_seq_len: int) -> list[Shape]:
    """``wanted`` when given (B,T, or B,T,P for with-past graphs), else the defaults of the first artifact that
    records its ranges; either way inside every artifact's ranges."""
    with_past = artifacts[0].with_past
    for shape in wanted:
        if len(shape) == (3 if with_past else 2):
            continue
        spelled = ",".join(map(str, shape))
        if with_past:
            raise ParityError(f"--shapes {spelled}: {artifacts[0].name} is a with-past graph; give B,T,P (batch, new "
                              "tokens, past length), e.g. 1,1,15")
        raise ParityError(f"--shapes {spelled}: {artifacts[0].name} takes no past; give B,T, e.g. 2,16")
    shapes = list(wanted) or default_shapes(next((a.dims for a in artifacts if a.dims), {}), with_past)
    refuse_shapes_outside(shapes, artifacts, max_seq_len)
    return shapes


def refuse_other_model(artifact: Artifact, model, checkpoint: Path) -> None:
    """One line when ``artifact`` was not exported from ``model``: a recorded config that differs, a with-past
    graph for a model without a KV cache, or inputs the model is not fed with."""
    cfg = model.config
    ours = {key: getattr(cfg, key) for key in CONFIG_KEYS if hasattr(cfg, key)}
    theirs = {**{k: artifact.recorded[k] for k in CONFIG_KEYS if k in artifact.recorded},
              **artifact.recorded.get("config", {})}
    differ = [key for key in CONFIG_KEYS if key in theirs and key in ours and theirs[key] != ours[key]]
    if differ:
        shown = differ[:3]
        raise ParityError(f"{artifact.name} was exported from another model ({_spell(theirs, shown)}; "
                          f"{checkpoint.name} has {_spell(ours, shown)}); pass the checkpoint it was exported from")
    if artifact.with_past and not has_past(model):
        raise ParityError(f"{artifact.name} is a with-past graph (docs/decode.md), but {checkpoint.name} is a "
                          f"{cfg.arch} checkpoint, which has no KV cache; pass the checkpoint it was exported from")
    expected = checkpoint_input_names(model, artifact.with_past)
    if set(artifact.inputs) != set(expected):
        kind = "with-past " if artifact.with_past else ""
        raise ParityError(f"{artifact.name} takes the inputs {_names(artifact.inputs)}, but the {kind}graph of the "
                          f"{cfg.arch} checkpoint {checkpoint.name} takes {_names(expected)}: the file was exported "
                          "from another kind of model; pass its own checkpoint")


def checkpoint_input_names(model, with_past: bool) -> list[str]:
    from attnres_export.models.base import step_input_axes

    return list(step_input_axes(model.with_past().cache_inputs())) if with_past else list(model.input_axes)


def refuse_other_shapes(artifact: Artifact, references: References, checkpoint: Path) -> None:
    """One line when the artifact's fixed dims (heads, head size, vocabulary) or its outputs are not the model's,
    read from the feeds and outputs of the first shape before the artifact runs."""
    shape = references.shapes[0]
    declared = [(f"input {name}", artifact.inputs.get(name), array.shape)
                for name, array in references.feeds[shape].items()]
    for name, array in references.expected[shape].items():
        if artifact.outputs and name not in artifact.outputs:
            raise ParityError(f"{artifact.name} has no output {name!r} (it has {_names(artifact.outputs)}), which "
                              f"{checkpoint.name}'s model computes: the file was exported from another kind of model; "
                              "pass its own checkpoint")
        declared.append((f"output {name}", artifact.outputs.get(name), array.shape))
    for what, axes, real in declared:
        if axes is None:
            continue
        fixed = [(i, size) for i, size in enumerate(axes) if isinstance(size, int) and size > 0]
        if len(axes) != len(real) or any(real[i] != size for i, size in fixed):
            raise ParityError(f"{artifact.name}'s {what} has dims {_axes(axes)}, but {checkpoint.name}'s model has "
                              f"{_axes(real)} there: the file was exported from another model; pass the checkpoint "
                              "it was exported from")


def _spell(values: dict, keys: list[str]) -> str:
    return ", ".join(f"{key} {values[key]}" for key in keys)


def _names(names) -> str:
    return ", ".join(sorted(names))


def _axes(axes) -> str:
    return "[" + ", ".join(map(str, axes)) + "]"


def describe_onnx(path: Path, provider: str = "cpu") -> Artifact:
    """An ONNX file as a check sees it (its weights are not read here)."""
    from attnres_export.backends.factory import onnx_runner_class
    from attnres_export.graphs.load import load_onnx
    from attnres_export.graphs.metadata import export_info, input_axes, onnx_dtype
    from attnres_export.graphs.targets import detect_target

    runner_class = onnx_runner_class(provider)
    model = load_onnx(path, load_external_data=False)
    recorded = export_info(model)
    inputs = input_axes(model)
    outputs = {o.name: [d.dim_param if d.dim_param else d.dim_value for d in o.type.tensor_type.shape.dim]
               if o.type.tensor_type.HasField("shape") else None for o in model.graph.output}
    with_past = bool(recorded.get("with_past")) or _takes_past(inputs)
    return Artifact(path, onnx_dtype(model), with_past, recorded.get("dims", {}), inputs, outputs, recorded,
                    detect_target(model), lambda: runner_class(path, artifact=path.name))


def describe_engine(path: Path, plugin: Path | None = None, allow_engine_host_code: bool = False,
                    engine_dtype: str | None = None) -> Artifact:
    """A TensorRT engine as a check sees it: ranges and input axes from its manifest (or the engine itself), its
    dtype from the manifest, ``engine_dtype`` or what its I/O types prove."""
    from attnres_export.backends.factory import engine_runner
    from attnres_export.dtypes import STORAGE_TYPES

    runner, dtype = engine_runner(path, plugin, allow_engine_host_code, engine_dtype)
    if dtype is None:
        raise ParityError(f"{path.name} has no manifest, and its input and output types do not tell its dtype "
                          "(attnres exports write float32 logits in every dtype); pass --engine-dtype "
                          f"{'|'.join(STORAGE_TYPES)}, the dtype of the ONNX it was built from")
    inputs = runner.input_axes()
    dims = runner.manifest.dims if runner.manifest is not None else {}
    return Artifact(path, dtype, _takes_past(inputs), dims, inputs, {}, {}, None, lambda: runner,
                    runner.plugin_to_load())


def _takes_past(inputs: dict) -> bool:
    return any(name.startswith("past_key_values.") for name in inputs)


def check_artifacts(checkpoint: Path, onnx: Sequence[Path] = (), engines: Sequence[Path] = (), *,
                    shapes: Sequence[Shape] = (), seed: int = 0, tolerances: dict[str, Tolerance] | None = None,
                    ort_provider: str = "cpu", plugin: Path | None = None, allow_engine_host_code: bool = False,
                    engine_dtype: str | None = None, status: Status = lambda _: None) -> CheckResult:
    """Check every ONNX file (on ONNX Runtime, ``ort_provider``) and TensorRT engine against ``checkpoint``'s
    PyTorch model on the same inputs. Plain and with-past graphs are checked in separate runs (they take
    different inputs). Raises ParityError (one line) for a mismatch found before running."""
    from attnres_export.models import load_checkpoint

    if not onnx and not engines:
        raise ParityError("nothing to check: pass at least one --onnx FILE or --engine FILE")
    status("reading the artifacts")
    artifacts = [*(describe_onnx(Path(p), ort_provider) for p in onnx),
                 *(describe_engine(Path(p), plugin, allow_engine_host_code, engine_dtype) for p in engines)]
    past = [a for a in artifacts if a.with_past]
    if past and len(past) < len(artifacts):
        plain = next(a for a in artifacts if not a.with_past)
        raise ParityError(f"{past[0].name} is a with-past graph and {plain.name} is not: they take different inputs; "
                          "check them in separate runs")
    with_past = bool(past)
    status(f"loading {checkpoint}")
    model, cfg = load_checkpoint(Path(checkpoint), dtype=None)
    for artifact in artifacts:
        refuse_other_model(artifact, model, Path(checkpoint))
    run_shapes = choose_shapes(artifacts, shapes, cfg.max_seq_len)
    by_feeds: dict[str | None, References] = {}
    for artifact in artifacts:
        key = artifact.dtype if with_past else None
        if key not in by_feeds:
            by_feeds[key] = reference_outputs(checkpoint_subject(model, with_past, artifact.dtype, seed), run_shapes,
                                              status, [a.dtype for a in artifacts])
    del model
    gc.collect()
    runs = []
    for artifact in artifacts:
        references = by_feeds[artifact.dtype if with_past else None]
        refuse_other_shapes(artifact, references, Path(checkpoint))
        runs.append(ArtifactRun(artifact.open, artifact.dtype, tolerance_for(artifact.dtype, tolerances), references))
    report = judge_artifacts(runs, status)
    for artifact, run in zip(artifacts, runs, strict=True):
        if artifact.target is not None:  # an ONNX file: its routers' choices can be read (docs/parity.md)
            report = with_artifact_routing(report, artifact.path, artifact.name, run.references,
                                           lambda: load_checkpoint(Path(checkpoint), dtype=None)[0], run.tolerance,
                                           status)
    report.extra.update({"checkpoint": str(checkpoint), "seed": seed})
    if with_past:
        report.extra.update({"with_past": True, "shapes": "batch x seq x past"})
    return CheckResult(report, artifacts, [run.references for run in runs], run_shapes)
