"""What the kernels' self-tests share: the base every op's self-test implements, storage types with their
launcher codes, the pass bars (docs/parity.md#pass-bars), error metrics, random sources and the pointer table of
the aggregate launchers, GPU timing, and the GPU label every table title carries.

Imports only torch and ``attnres_export.dtypes``, so the self-test runs on a GPU machine without ONNX Runtime.
"""

from __future__ import annotations

import ctypes
import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from attnres_export.dtypes import STORAGE_TYPES
from attnres_export.plugins.selftest.table import TextTable, table

DTYPES: dict[str, tuple[torch.dtype, int]] = {
    name: (getattr(torch, name), storage.kernel_code) for name, storage in STORAGE_TYPES.items()
}
"""Name -> (torch dtype, the launchers' dtype code)."""


def passes(dtype: str, rel_l2: float, cosine: float) -> bool:
    """The pass bar of ``dtype`` against the float32 reference; NaN never passes."""
    bar = STORAGE_TYPES[dtype].tolerance
    return rel_l2 <= bar.rel_l2 and cosine >= bar.cosine


def error_metrics(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(relative L2, cosine, max abs error) of out against ref, in float64."""
    o, r = out.double().flatten(), ref.double().flatten()
    rel_l2 = float((o - r).norm() / r.norm().clamp_min(1e-300))
    cosine = float(torch.dot(o, r) / (o.norm() * r.norm()).clamp_min(1e-300))
    return rel_l2, cosine, float((o - r).abs().max())


def pointer_table(sources: list[torch.Tensor]) -> ctypes.Array:
    """Host array of device pointers, as the aggregate launchers take their sources."""
    return (ctypes.c_void_p * len(sources))(*[s.data_ptr() for s in sources])


def random_sources(n: int, rows: int, d: int, dtype: str, misaligned: bool, generator: torch.Generator,
                   device: str = "cuda") -> list[torch.Tensor]:
    """n sources [rows, d] of different scales (0.5 to 2); ``misaligned`` ones start one element into their
    storage, so that the launchers take their one-element paths."""
    sources = []
    for i in range(n):
        scale = 0.5 + 1.5 * i / max(1, n - 1)
        if misaligned:
            flat = torch.randn(rows * d + 1, device=device, generator=generator) * scale
            sources.append(flat.to(DTYPES[dtype][0])[1:].view(rows, d))
        else:
            sources.append((torch.randn(rows, d, device=device, generator=generator) * scale).to(DTYPES[dtype][0]))
    return sources


def gpu_label(capability: tuple[int, int], name: str) -> str:
    """``sm_90 (NVIDIA H200)``: the architecture each table title names, so runs on several GPUs stay apart."""
    return f"sm_{capability[0]}{capability[1]} ({name})"


def current_gpu_label() -> str:
    """gpu_label of torch's current CUDA device."""
    return gpu_label(torch.cuda.get_device_capability(), torch.cuda.get_device_name())


def worst_rel_l2(result: dict) -> float | None:
    """The largest relative L2 error a result records (keys ending in ``rel_l2``), NaN if one is NaN; None when
    it records none (gold and argument checks)."""
    values = [float(v) for k, v in result.items() if k.endswith("rel_l2") and isinstance(v, int | float)]
    if not values:
        return None
    return float("nan") if any(math.isnan(v) for v in values) else max(values)


def correctness_table(results: Iterable[dict], gpu: str) -> TextTable:
    """One row per op and storage type: checks passed and the worst relative L2 error; titled with the GPU."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r.get("op", "?"), r.get("dtype", "-")), []).append(r)
    rows = []
    for (op, dtype), group in groups.items():
        errors = [e for e in map(worst_rel_l2, group) if e is not None]
        worst = float("nan") if not errors or any(math.isnan(e) for e in errors) else max(errors)
        rows.append((op, dtype, f"{sum(1 for r in group if r['ok'])}/{len(group)}", f"{worst:.2e}"))
    columns = ("op", "dtype", "passed", "worst rel L2")
    return table(f"Kernel correctness against the float32 references on {gpu}", columns, rows, right=columns)


def gpu_times_us(run: Callable[[int], None], sets: int, iters: int) -> float:
    """Median GPU time of one call: a sleep kernel first lets the CPU queue every launch ahead of the GPU."""
    for i in range(3):
        run(i % sets)
    torch.cuda.synchronize()
    times: list[float] = []
    batch = 25
    for start in range(0, iters, batch):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(batch)]
        torch.cuda._sleep(20_000_000)
        for j, (begin, end) in enumerate(events[: min(batch, iters - start)]):
            begin.record()
            run((start + j) % sets)
            end.record()
        torch.cuda.synchronize()
        times += [b.elapsed_time(e) * 1000.0 for b, e in events[: min(batch, iters - start)]]
    return statistics.median(times)


class OpSelftest(ABC):
    """One op's correctness self-test as the runner (``attnres_export.plugins.selftest.run``) drives it: its
    cases and its checks on the kernels library. Each op module defines one subclass."""

    op: str = ""
    """The op's name, in every result and table."""
    name: str = ""
    """The ``--op`` value that selects it."""

    @abstractmethod
    def correctness_cases(self, quick: bool) -> list[Any]:
        """The correctness cases (``--quick``: fewer)."""

    @abstractmethod
    def run_checks(self, library: Path, cases: list[Any], generator: torch.Generator) -> list[dict]:
        """Every check, each result a dict with ``op`` and ``ok``; a CUDA error fails its case, not the run."""


class TimedOpSelftest(OpSelftest):
    """An op's self-test that also times the kernel."""

    timings_key: str = ""
    """Where its timings go in the --json report."""

    @abstractmethod
    def performance_cases(self, quick: bool) -> list[Any]:
        """The timing cases (``--quick``: fewer)."""

    @abstractmethod
    def run_timings(self, library: Path, cases: list[Any], generator: torch.Generator, quick: bool) -> list[dict]:
        """Every timing case, freeing the large tensors between them."""

    @abstractmethod
    def perf_table(self, rows: list[dict], gpu: str) -> TextTable:
        """The timings of ``rows``; the title names ``gpu`` (``gpu_label``)."""

    def notes(self, timings: list[dict]) -> list[str]:
        """Lines printed after the timings table."""
        return []
