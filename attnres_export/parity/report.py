"""Running every backend on the same inputs and turning the runs into one verdict, table and JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnres_export.atomic import write_text_atomic
from attnres_export.backends.base import Runner
from attnres_export.dtypes import Tolerance
from attnres_export.parity.metrics import ErrorMetrics, compare, compare_scaled

MISSING = ErrorMetrics(float("inf"), float("inf"), float("inf"), 0.0, False)
"""Metrics of an output the backend did not produce."""

FeedMaker = Callable[[tuple[int, ...]], dict[str, np.ndarray]]


@dataclass
class Check:
    """One backend on one shape: metrics per output against the reference."""

    shape: list[int]
    backend: str
    artifact: str
    dtype: str
    outputs: dict[str, ErrorMetrics]

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.outputs.values())

    def to_dict(self) -> dict:
        return {"shape": self.shape, "backend": self.backend, "artifact": self.artifact, "dtype": self.dtype,
                "ok": self.ok, "outputs": {k: v.to_dict() for k, v in self.outputs.items()}}


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        return {"ok": self.ok, **self.extra, "checks": [c.to_dict() for c in self.checks]}

    def write_json(self, path: Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


def run_reference(reference: Runner, shapes: Sequence[tuple[int, ...]], make_feeds: FeedMaker
                  ) -> dict[tuple[int, ...], dict[str, np.ndarray]]:
    """The reference outputs per shape (kept by callers that also save them, e.g. for Polygraphy)."""
    with reference:
        return {shape: reference.infer(make_feeds(shape)) for shape in shapes}


def run_checks(
    reference: Runner | None,
    runners: Sequence[tuple[Runner, str, Tolerance]],
    shapes: Sequence[tuple[int, ...]],
    make_feeds: FeedMaker,
    progress: Callable[[str], None] | None = None,
    expected: dict[tuple[int, ...], dict[str, np.ndarray]] | None = None,
    precise: Runner | None = None,
    exact: dict[tuple[int, ...], dict[str, np.ndarray]] | None = None,
    same_type: dict[tuple[int, ...], dict[str, np.ndarray]] | None = None,
) -> Report:
    """Run ``reference`` (unless its ``expected`` outputs are given) and every (runner, dtype, tolerance) on the
    same feeds for each shape.

    With ``precise`` (the model in float64) or its ``exact`` outputs, every output is compared with the float64
    outputs, at a bar that scales with the float32 reference's own error there (``scaled_tolerance``), and with
    ``same_type`` (PyTorch's outputs in the runners' 16-bit type) with that run's error too; every error is
    reported."""
    report = Report()
    if expected is None:
        if reference is None:
            raise ValueError("run_checks needs a reference runner or its expected outputs")
        expected = run_reference(reference, shapes, make_feeds)
    if exact is None and precise is not None:
        exact = run_reference(precise, shapes, make_feeds)
    for runner, dtype, tol in runners:
        with runner:
            for shape in shapes:
                if progress:
                    progress(f"{runner.backend} at {'x'.join(map(str, shape))}")
                got = runner.infer(make_feeds(shape))
                metrics = {}
                for name, ref in expected[shape].items():
                    if name not in got:
                        metrics[name] = MISSING
                    elif exact is None:
                        metrics[name] = compare(got[name], ref, tol)
                    else:
                        own = compare(ref, exact[shape][name], tol)
                        half = None if same_type is None else compare(same_type[shape][name], exact[shape][name], tol)
                        metrics[name] = compare_scaled(got[name], exact[shape][name], tol, own, half)
                report.checks.append(Check(list(shape), runner.backend, runner.artifact, dtype, metrics))
    return report
