"""What the kernels' self-tests share: storage types with their launcher codes, the pass bars
(docs/parity.md#pass-bars), error metrics, random sources and the pointer table of the aggregate launchers, and
the GPU label every table title carries.

Imports only torch, rich and ``attnres_export.dtypes``, so the self-test runs on a GPU machine without ONNX Runtime.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable

import torch
from rich.table import Table

from attnres_export.dtypes import STORAGE_TYPES

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


def correctness_table(results: Iterable[dict], gpu: str) -> Table:
    """One row per op and storage type: checks passed and the worst relative L2 error; titled with the GPU."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r.get("op", "?"), r.get("dtype", "-")), []).append(r)
    table = Table(title=f"Kernel correctness against the float32 references on {gpu}")
    for col in ("op", "dtype", "passed", "worst rel L2"):
        table.add_column(col, justify="right")
    for (op, dtype), rows in groups.items():
        errors = [e for e in map(worst_rel_l2, rows) if e is not None]
        worst = float("nan") if not errors or any(math.isnan(e) for e in errors) else max(errors)
        table.add_row(op, dtype, f"{sum(1 for r in rows if r['ok'])}/{len(rows)}", f"{worst:.2e}")
    return table
