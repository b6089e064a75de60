"""GPU self-test of the AttnResAggregate kernel (``--op aggregate`` of ``python -m attnres_export.plugins.selftest``).

Calls ``attnresAggregateLaunch`` of libattnres_kernels.so through ctypes (no TensorRT): checks every dtype and path
(warp / block / two-sweep, vector / scalar) on fresh random inputs with a NaN-poisoned output against
``attnres_export.ops.attnres_aggregate_reference``, and times it next to a device-to-device copy of the same bytes
and PyTorch eager.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnres_export.ops import attnres_aggregate_reference
from attnres_export.plugins.selftest.common import (
    DTYPES,
    TimedOpSelftest,
    error_metrics,
    gpu_times_us,
    passes,
    pointer_table,
    random_sources,
)
from attnres_export.plugins.selftest.table import TextTable, table

AGGREGATE_OP = "AttnResAggregate"

EPS = 1e-6
L2_BYTES = 50 * 2**20
"""H200's L2; timed input sets rotate through several times this so DRAM, not L2, serves them."""


@dataclass(frozen=True)
class Case:
    """One shape: n sources of [rows, d]; misaligned sources take the scalar path."""

    n: int
    rows: int
    d: int
    dtype: str
    misaligned: bool = False

    def bytes_moved(self) -> int:
        """Traffic floor: each source read once, the output written once."""
        return (self.n + 1) * self.rows * self.d * DTYPES[self.dtype][0].itemsize


def correctness_cases(quick: bool) -> list[Case]:
    """Every D, source count and row count of the self-test plan, pruned where large shapes add nothing new."""
    ds = (64, 1001, 7168, 20000) if quick else (64, 1000, 1001, 4096, 7168, 16384, 20000)
    ns = (1, 9, 33) if quick else (1, 2, 9, 33)
    cases: list[Case] = []
    for dtype in DTYPES:
        cases += [Case(n, rows, d, dtype) for d in ds for n in ns for rows in (1, 7)]
        big = [(9, 4096, 7168), (2, 16384, 64), (33, 4096, 1000)]
        if not quick:
            big += [(9, 4096, d) for d in (64, 1000, 4096)]
            big += [(2, 16384, d) for d in (1000, 4096, 7168)]
            big += [(9, 16384, 7168), (33, 4096, 4096), (33, 1, 7168)]
        cases += [Case(n, rows, d, dtype) for n, rows, d in big]
        cases += [Case(9, 7, 4096, dtype, misaligned=True), Case(2, 33, 1000, dtype, misaligned=True)]
    return cases


def performance_cases(quick: bool) -> list[Case]:
    """Large-row throughput shapes, then decode (rows = 1)."""
    dtypes = ("bfloat16",) if quick else tuple(DTYPES)
    shapes = [(9, 16384, 7168), (2, 16384, 7168)]
    if not quick:
        shapes += [(33, 4096, 4096), (9, 16384, 1000), (9, 16384, 64)]
    cases = [Case(n, rows, d, dt) for dt in dtypes for n, rows, d in shapes]
    cases += [Case(n, 1, 7168, dt) for dt in dtypes for n in (2, 9)]
    return cases


class Kernels:
    """ctypes binding of attnresAggregateLaunch."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        fn = self.lib.attnresAggregateLaunch
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int32,
            ctypes.c_int64,
            ctypes.c_int32,
            ctypes.c_float,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        fn.restype = ctypes.c_int
        self.fn = fn

    def launch(
        self, sw: torch.Tensor, table: ctypes.Array, n: int, rows: int, d: int, code: int, out: torch.Tensor
    ) -> None:
        """Enqueue on torch's current stream; raise on a CUDA error code."""
        stream = torch.cuda.current_stream().cuda_stream
        status = self.fn(sw.data_ptr(), table, n, rows, d, EPS, code, out.data_ptr(), stream)
        if status != 0:
            raise RuntimeError(f"attnresAggregateLaunch returned cudaError {status}")


def make_inputs(case: Case, generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Random sources of different scales and a score weight giving logits of a few units (not a mean)."""
    sw = torch.randn(case.d, device="cuda", generator=generator) * (3.0 / math.sqrt(case.d))
    return sw, random_sources(case.n, case.rows, case.d, case.dtype, case.misaligned, generator)


def check_case(kernels: Kernels, case: Case, generator: torch.Generator) -> dict:
    """Run once on a NaN-poisoned output and compare with the float32 reference."""
    sw, sources = make_inputs(case, generator)
    out = torch.full((case.rows, case.d), float("nan"), dtype=DTYPES[case.dtype][0], device="cuda")
    kernels.launch(sw, pointer_table(sources), case.n, case.rows, case.d, DTYPES[case.dtype][1], out)
    ref = attnres_aggregate_reference(sw, [s.float() for s in sources], EPS)
    torch.cuda.synchronize()
    unwritten = int(torch.isnan(out).sum())
    rel_l2, cosine, max_abs = error_metrics(out.float(), ref)
    ok = unwritten == 0 and passes(case.dtype, rel_l2, cosine)
    return {"op": AGGREGATE_OP, **asdict(case), "rel_l2": rel_l2, "cosine": cosine, "max_abs": max_abs,
            "unwritten": unwritten, "ok": ok}


def check_gold(kernels: Kernels) -> dict:
    """Gold check (docs/parity.md#gold-checks): D = 4, sources e0, e1, sw = 2 e0, eps = 0 give
    h = [0.98201379, 0.01798621, 0, 0]."""
    sw = torch.tensor([2.0, 0.0, 0.0, 0.0], device="cuda")
    sources = [torch.tensor([[1.0, 0, 0, 0]], device="cuda"), torch.tensor([[0.0, 1, 0, 0]], device="cuda")]
    out = torch.full((1, 4), float("nan"), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    status = kernels.fn(sw.data_ptr(), pointer_table(sources), 2, 1, 4, 0.0, 0, out.data_ptr(), stream)
    torch.cuda.synchronize()
    expected = torch.tensor([[0.98201379, 0.01798621, 0.0, 0.0]], device="cuda")
    err = float((out - expected).abs().max()) if status == 0 else float("nan")
    return {"op": AGGREGATE_OP, "check": "gold D=4", "status": status, "max_abs": err,
            "ok": status == 0 and err < 1e-6}


def time_case(kernels: Kernels, case: Case, generator: torch.Generator, quick: bool) -> dict:
    """Kernel, copy of the same bytes and PyTorch eager, each rotating input sets that overflow L2."""
    total = case.bytes_moved()
    sets = max(1, min(16, math.ceil(4 * L2_BYTES / total)))
    inputs = [make_inputs(case, generator) for _ in range(sets)]
    tables = [pointer_table(srcs) for _, srcs in inputs]
    dtype, code = DTYPES[case.dtype]
    outs = [torch.empty(case.rows, case.d, dtype=dtype, device="cuda") for _ in range(sets)]
    iters = 25 if quick else 50

    def kernel_run(i: int) -> None:
        kernels.launch(inputs[i][0], tables[i], case.n, case.rows, case.d, code, outs[i])

    kernel_us = gpu_times_us(kernel_run, sets, iters)

    half = total // 2
    copy_src = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(sets)]
    copy_dst = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(sets)]
    copy_us = gpu_times_us(lambda i: copy_dst[i].copy_(copy_src[i]), sets, iters)
    copy_src.clear()
    copy_dst.clear()

    eager_us = gpu_times_us(
        lambda i: attnres_aggregate_reference(inputs[i][0], inputs[i][1], EPS), sets, 5 if quick else 10
    )
    return {
        **asdict(case),
        "bytes": total,
        "kernel_us": kernel_us,
        "kernel_gbps": total / kernel_us / 1e3,
        "copy_us": copy_us,
        "copy_gbps": total / copy_us / 1e3,
        "fraction_of_copy": copy_us / kernel_us,
        "eager_us": eager_us,
        "speedup_vs_eager": eager_us / kernel_us,
    }


class AggregateSelftest(TimedOpSelftest):
    op = AGGREGATE_OP
    name = "aggregate"
    timings_key = "performance"

    def correctness_cases(self, quick: bool) -> list[Case]:
        return correctness_cases(quick)

    def performance_cases(self, quick: bool) -> list[Case]:
        return performance_cases(quick)

    def run_checks(self, library: Path, cases: list[Case], generator: torch.Generator) -> list[dict]:
        """The gold check, then every case."""
        kernels = Kernels(library)
        results = [check_gold(kernels)]
        for case in cases:
            try:
                results.append(check_case(kernels, case, generator))
            except RuntimeError as exc:
                results.append({"op": AGGREGATE_OP, **asdict(case), "error": str(exc), "ok": False})
            torch.cuda.empty_cache()
        return results

    def run_timings(self, library: Path, cases: list[Case], generator: torch.Generator, quick: bool) -> list[dict]:
        kernels = Kernels(library)
        timings = []
        for case in cases:
            timings.append(time_case(kernels, case, generator, quick))
            torch.cuda.empty_cache()
        return timings

    def perf_table(self, rows: list[dict], gpu: str) -> TextTable:
        columns = ("n", "rows", "D", "dtype", "time us", "GB/s", "of copy", "vs eager")
        cells = [(str(r["n"]), str(r["rows"]), str(r["d"]), r["dtype"], f"{r['kernel_us']:.1f}",
                  f"{r['kernel_gbps']:.0f}", f"{r['fraction_of_copy']:.0%}", f"{r['speedup_vs_eager']:.1f}x")
                 for r in rows]
        return table(f"AttnResAggregate kernel vs copy of the same bytes and PyTorch eager on {gpu}", columns, cells,
                     right=columns)

    def notes(self, timings: list[dict]) -> list[str]:
        """The decode (rows = 1) latencies, one line each."""
        decode = [r for r in timings if r["rows"] == 1]
        return [f"decode n={r['n']} D={r['d']} {r['dtype']}: {r['kernel_us']:.2f} us" for r in decode]


SELFTEST = AggregateSelftest()
