"""Inputs and reference outputs in Polygraphy's JSON formats, so ``polygraphy run --load-inputs/--load-outputs``
reproduces a check with NVIDIA's own tool.

Inputs are a list of feed dicts (one per iteration); outputs are a ``RunResults`` holding one runner with one
iteration per shape. Polygraphy's own writer is used when it is installed (an optional dependency); otherwise
the same format is written here: arrays are ``np.save`` bytes in base64 tagged ``polygraphy_class: ndarray``.

``save_replays`` writes, per artifact of a check, one pair of files per shape and a ``replay.sh`` that runs
``polygraphy run`` once per shape at the bar the check judged that shape against: Polygraphy's ``l2`` metric is
the absolute L2 distance, so the relative-L2 bar becomes ``bar * norm(reference)`` for each shape and output,
and its ``cosine_similarity`` bar is the check's cosine bar. The reference is what the check compared with
(float64 PyTorch where the bars scale, docs/parity.md#pass-bars).
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnres_export.atomic import atomic_write, write_text_atomic
from attnres_export.parity.check import Artifact, CheckResult
from attnres_export.parity.report import Check
from attnres_export.parity.types import References

INPUTS_FILE = "inputs.json"
OUTPUTS_FILE = "outputs.json"
CLASS_KEY = "polygraphy_class"
Feeds = dict[str, np.ndarray]


def save_polygraphy(directory: Path, inputs: Sequence[Feeds], outputs: Sequence[Feeds],
                    runner_name: str) -> tuple[Path, Path]:
    """Write ``inputs.json`` and ``outputs.json`` into ``directory`` (atomically); returns their paths."""
    directory = Path(directory)
    paths = directory / INPUTS_FILE, directory / OUTPUTS_FILE
    try:
        _save_with_polygraphy(paths, inputs, outputs, runner_name)
    except ImportError:
        write_text_atomic(paths[0], json.dumps([_encode_feeds(f) for f in inputs], indent=4))
        write_text_atomic(paths[1], json.dumps(_run_results(outputs, runner_name), indent=4))
    return paths


def _save_with_polygraphy(paths: tuple[Path, Path], inputs: Sequence[Feeds], outputs: Sequence[Feeds],
                          runner_name: str) -> None:
    from polygraphy.comparator import IterationResult, RunResults
    from polygraphy.json import save_json

    results = RunResults()
    results.append((runner_name, [IterationResult(dict(o), runner_name=runner_name) for o in outputs]))
    with atomic_write(paths[0]) as tmp:
        save_json([dict(f) for f in inputs], str(tmp))
    with atomic_write(paths[1]) as tmp:
        save_json(results, str(tmp))


def _array(value: np.ndarray) -> dict:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(value), allow_pickle=False)
    return {"array": base64.b64encode(buffer.getvalue()).decode(), CLASS_KEY: "ndarray"}


def _encode_feeds(feeds: Feeds) -> dict:
    return {name: _array(value) for name, value in feeds.items()}


def _run_results(outputs: Sequence[Feeds], runner_name: str) -> dict:
    iterations = [{"outputs": {name: {"values": _array(v), CLASS_KEY: "LazyArray"} for name, v in o.items()},
                   "runtime": None, "runner_name": runner_name, CLASS_KEY: "IterationResult"} for o in outputs]
    return {"lst": [[runner_name, iterations]], CLASS_KEY: "RunResults"}


REPLAY_SCRIPT = "replay.sh"


@dataclass
class Replay:
    """How one artifact of a check replays in Polygraphy."""

    artifact: str
    where: str
    """The runtime the replay uses, and whether it runs on this machine."""
    script: Path | None
    """``sh SCRIPT`` replays the check; None when the artifact cannot be replayed (``where`` says why)."""
    commands: list[str]
    """The ``polygraphy run`` commands in the script, one per shape."""
    runs_here: bool


def save_replays(directory: Path, result: CheckResult) -> list[Replay]:
    """Write ``DIR/<artifact>/`` for each artifact of ``result``: inputs and reference outputs per shape and a
    ``replay.sh`` of one ``polygraphy run`` per shape at the check's own bars."""
    replays = []
    for artifact, references in zip(result.artifacts, result.references, strict=True):
        checks = [c for c in result.report.checks if c.artifact == artifact.name]
        replays.append(_save_replay(Path(directory) / artifact.name, artifact, references, checks))
    return replays


def _save_replay(folder: Path, artifact: Artifact, references: References, checks: list[Check]) -> Replay:
    runtime, where, runs_here = replay_runtime(artifact)
    if runtime is None:
        return Replay(artifact.name, where, None, [], False)
    name, reference = references.judged_against
    builds_engine = "--trt" in runtime and artifact.target is not None
    commands = []
    for shape, check in zip(references.shapes, checks, strict=True):
        label = "x".join(map(str, shape))
        inputs, outputs = save_polygraphy(folder / label, [references.feeds[shape]], [reference[shape]], name)
        commands.append(shlex.join(["polygraphy", "run", _beside(artifact.path, folder), *runtime,
                                    *(_profile(references.feeds[shape]) if builds_engine else []),
                                    "--load-inputs", _beside(inputs, folder),
                                    "--load-outputs", _beside(outputs, folder),
                                    "--validate", "--compare-func", "l2", "cosine_similarity",
                                    *_bars(check, reference[shape])]))
    script = folder / REPLAY_SCRIPT
    write_text_atomic(script, "#!/bin/sh\n# Replays `attnres check` on " + artifact.name + ", one run per shape, at "
                      "the bars of the check; its paths are relative to this script's folder.\nset -e\n"
                      'cd "$(dirname "$0")"\n' + "\n".join(commands) + "\n")
    return Replay(artifact.name, where, script, commands, runs_here)


def _beside(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder``, where the replay script runs: the folder, with the artifact beside it, can
    move (a plugin library stays where it was built, named by its absolute path)."""
    return os.path.relpath(path.resolve(), folder.resolve())


def replay_runtime(artifact: Artifact) -> tuple[list[str] | None, str, bool]:
    """Polygraphy's runner options for ``artifact``, where it runs, and whether it runs on this machine."""
    polygraphy = importlib.util.find_spec("polygraphy") is not None
    if artifact.target is None:
        plugin = ["--plugins", str(artifact.plugin)] if artifact.plugin is not None else []
        return (["--model-type", "engine", "--trt", *plugin], "TensorRT (needs TensorRT and its GPU)", False)
    if artifact.target == "ort-trt":
        return None, "no replay: no ONNX Runtime runs the ort-trt target yet (docs/tensorrt.md)", False
    if artifact.target == "portable" and artifact.dtype != "bfloat16":
        here = polygraphy and importlib.util.find_spec("onnxruntime") is not None
        return (["--onnxrt", "--providers", "cpu"],
                "ONNX Runtime CPU, " + ("runs here" if here else "needs polygraphy and onnxruntime"), here)
    if artifact.target == "portable":
        return (["--trt", "--strongly-typed"], "TensorRT (ONNX Runtime's CPU provider has no bfloat16 kernels; "
                "needs TensorRT and a GPU)", False)
    from attnres_export.plugins.build import find_libraries

    built = find_libraries(with_tensorrt=True)
    if built is None or built.trt is None:
        return (None, "no replay yet: the attnres nodes run in TensorRT with libattnres_trt.so; build it "
                "(`attnres plugin build`), then check again", False)
    return (["--trt", "--strongly-typed", "--plugins", str(built.trt)],
            "TensorRT with the attnres plugin (needs TensorRT and a GPU)", False)


def _profile(feeds: Feeds) -> list[str]:
    """A TensorRT optimization profile of exactly the feeds' shapes (each run builds for its own shape)."""
    shapes = [f"{name}:[{','.join(map(str, array.shape))}]" for name, array in feeds.items()]
    return [flag for option in ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes")
            for flag in (option, *shapes)]


def _bars(check: Check, reference: Feeds) -> list[str]:
    """Per output, the absolute L2 bar (the relative bar times the reference's norm) and the cosine bar."""
    l2, cosine = [], []
    for name, metrics in check.outputs.items():
        if metrics.rel_l2_bar is None or metrics.cosine_bar is None:
            continue  # an output the artifact did not produce: Polygraphy fails it as the check did
        norm = float(np.linalg.norm(np.asarray(reference[name], dtype=np.float64).ravel()))
        l2.append(f"{name}:{metrics.rel_l2_bar * (norm if norm > 0 else 1.0)!r}")
        cosine.append(f"{name}:{metrics.cosine_bar!r}")
    return ["--l2-threshold", *l2, "--cosine-similarity-threshold", *cosine]
