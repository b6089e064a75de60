"""The parity check of an attnres checkpoint's artifacts on disk (docs/parity.md): ``attnres check`` and
``attnres_export.api.check`` run ``check_artifacts``. It reads what each artifact was exported for, opens the
checkpoint once (``models.store.open_checkpoint``), refuses a checkpoint that is not the one an artifact came from
and shapes outside the exported ranges (one line each, before any weight is read), picks the shapes, and runs the
steps of ``parity/session.py`` (references, judging, the routing-aware comparison) on the model that one opened
checkpoint gives. The check ``attnres-export`` runs on the file it stages is ``parity/session.py: check_onnx``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from attnres_export.backends.base import Runner
from attnres_export.dims import DimRange, check_shapes, check_shapes_with_past
from attnres_export.dtypes import Tolerance
from attnres_export.errors import ParityError
from attnres_export.graphs.metadata import INT8_ACTIVATIONS_KEY, QUANTIZE_KEY
from attnres_export.parity.feeds import has_past
from attnres_export.parity.int8_activations import reference_with
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.report import Report
from attnres_export.parity.session import CheckSession
from attnres_export.parity.types import ArtifactRun, References, Shape, Status

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
class CheckResult:
    report: Report
    artifacts: list[Artifact]
    references: list[References]
    """Per artifact, the references it was judged on (for a Polygraphy replay)."""
    shapes: list[Shape]


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
    graph for a model without a KV cache, or inputs the model is not fed with. No weight of ``model`` is read
    (``check_artifacts`` passes a ``weightless_model``)."""
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
    from attnres_export.models.store import open_checkpoint

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
    opened = quantized_as_exported(open_checkpoint(Path(checkpoint)), artifacts)
    weightless = weightless_model(opened.config)
    for artifact in artifacts:
        refuse_other_model(artifact, weightless, Path(checkpoint))
    del weightless
    run_shapes = choose_shapes(artifacts, shapes, opened.config.max_seq_len)
    session = CheckSession(reference_with(lambda: opened.model(None), int8_activations_of(artifacts)), seed, status)
    by_feeds = session.references(run_shapes, with_past, [a.dtype for a in artifacts])
    runs = []
    for artifact in artifacts:
        references = by_feeds[artifact.dtype if with_past else None]
        refuse_other_shapes(artifact, references, Path(checkpoint))
        # an ONNX file: its routers' choices can be read (docs/parity.md#routing-aware-comparison)
        routing = (artifact.path, artifact.name) if artifact.target is not None else None
        runs.append(ArtifactRun(artifact.open, artifact.dtype, tolerance_for(artifact.dtype, tolerances), references,
                                routing))
    report = session.judge(runs)
    report.extra.update({"checkpoint": str(checkpoint), "seed": seed})
    if with_past:
        report.extra.update({"with_past": True, "shapes": "batch x seq x past"})
    return CheckResult(report, artifacts, [run.references for run in runs], run_shapes)


def quantized_as_exported(opened, artifacts: Sequence[Artifact]):
    """The checkpoint quantized on read as ``attnres-export --quantize`` quantized it for ``artifacts`` (their
    metadata's ``quantize``), so that they are checked against the model they hold; refuses artifacts quantized
    differently in one line."""
    settings = {json.dumps(a.recorded.get(QUANTIZE_KEY), sort_keys=True) for a in artifacts}
    if len(settings) > 1:
        raise ParityError("the artifacts were exported with different --quantize settings; check them in separate "
                          "runs")
    quantize = artifacts[0].recorded.get(QUANTIZE_KEY) if artifacts else None
    if not quantize:
        return opened
    block = quantize["block_size"]
    return opened.quantized_on_read(int(quantize["bits"]), None if block is None else int(block),
                                    bool(quantize["embeddings"]))


def int8_activations_of(artifacts: Sequence[Artifact]) -> dict[str, int] | None:
    """The weights whose activations ``artifacts`` quantize to int8 (their metadata's ``int8_activations``), which
    the reference quantizes the same way; refuses artifacts that differ in one line."""
    settings = {json.dumps(a.recorded.get(INT8_ACTIVATIONS_KEY), sort_keys=True) for a in artifacts}
    if len(settings) > 1:
        raise ParityError("the artifacts were exported with and without --int8-activations; check them in separate "
                          "runs")
    return artifacts[0].recorded.get(INT8_ACTIVATIONS_KEY) if artifacts else None


def weightless_model(config) -> torch.nn.Module:
    """``config``'s model on the meta device (no weights): what ``refuse_other_model`` reads (its config, inputs and
    with-past graph), before any weight is read."""
    from attnres_export.models.registry import build_model

    with torch.device("meta"):
        return build_model(config).eval()
