"""Inputs and reference outputs in Polygraphy's JSON formats, so ``polygraphy run --load-inputs/--load-outputs``
reproduces a check with NVIDIA's own tool.

Inputs are a list of feed dicts (one per iteration); outputs are a ``RunResults`` holding one runner with one
iteration per shape. Polygraphy's own writer is used when it is installed (an optional dependency); otherwise
the same format is written here: arrays are ``np.save`` bytes in base64 tagged ``polygraphy_class: ndarray``.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnres_export.atomic import atomic_write, write_text_atomic

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
