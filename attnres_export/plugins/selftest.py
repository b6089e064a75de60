"""GPU self-test of the AttnResAggregate, AttnResAggregateNorm and ResidualScoreAttention kernels: correctness,
then speed.

``python -m attnres_export.plugins.selftest [--quick] [--op aggregate|aggregate_norm|rsa|all] [--json PATH]
[--dry-run]``. Builds libattnres_kernels.so for the detected GPU, calls it through ctypes (no TensorRT).
AttnResAggregate: checks every dtype and path (warp / block / two-sweep, vector / scalar) on fresh random inputs
with a NaN-poisoned output, and times it next to a device-to-device copy of the same bytes and PyTorch eager.
AttnResAggregateNorm (correctness only): see ``attnres_export.plugins.selftest_aggregate_norm``.
ResidualScoreAttention: see ``attnres_export.plugins.selftest_rsa``. Every table's title names the GPU
(``sm_90 (NVIDIA H200)``), so runs on several architectures give one table each. Exit 0: all checks pass;
1: a mismatch; 2: no GPU or the build failed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnres_export.ops import attnres_aggregate_reference
from attnres_export.plugins import selftest_aggregate_norm, selftest_rsa
from attnres_export.plugins.build import PluginBuildError, build_plugins
from attnres_export.plugins.selftest_common import (
    DTYPES,
    correctness_table,
    current_gpu_label,
    error_metrics,
    passes,
    pointer_table,
    random_sources,
)

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


def gpu_times_us(run, sets: int, iters: int) -> float:
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


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnres_export.plugins.selftest",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes, bfloat16 timing only")
    parser.add_argument("--json", type=Path, help="write every result to this file")
    parser.add_argument("--dry-run", action="store_true", help="list the cases and exit (no GPU needed)")
    parser.add_argument("--cuda-arch", help="override the architecture (default: the detected GPU's)")
    parser.add_argument("--out", type=Path, help="build folder (default: the plugin cache)")
    parser.add_argument(
        "--op",
        choices=("aggregate", "aggregate_norm", "rsa", "all"),
        default="all",
        help="which kernel: AttnResAggregate, AttnResAggregateNorm (aggregate_norm, correctness only), "
        "ResidualScoreAttention (rsa) or all three (default)",
    )
    return parser.parse_args(argv)


def _perf_table(rows: list[dict], gpu: str) -> Table:
    table = Table(title=f"AttnResAggregate kernel vs copy of the same bytes and PyTorch eager on {gpu}")
    for col in ("n", "rows", "D", "dtype", "time us", "GB/s", "of copy", "vs eager"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["n"]),
            str(r["rows"]),
            str(r["d"]),
            r["dtype"],
            f"{r['kernel_us']:.1f}",
            f"{r['kernel_gbps']:.0f}",
            f"{r['fraction_of_copy']:.0%}",
            f"{r['speedup_vs_eager']:.1f}x",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    """Build, check, time; the exit status says whether every check passed."""
    args = _parse(argv)
    console = Console()
    aggregate, rsa = args.op in ("aggregate", "all"), args.op in ("rsa", "all")
    norm = args.op in ("aggregate_norm", "all")
    checks, perf = (correctness_cases(args.quick), performance_cases(args.quick)) if aggregate else ([], [])
    norm_checks = selftest_aggregate_norm.correctness_cases(args.quick) if norm else []
    rsa_checks = selftest_rsa.correctness_cases(args.quick) if rsa else []
    rsa_perf = selftest_rsa.performance_cases(args.quick) if rsa else []
    if args.dry_run:
        for case in [*checks, *norm_checks, *rsa_checks]:
            console.print(f"check {case}", highlight=False, soft_wrap=True)
        for case in [*perf, *rsa_perf]:
            console.print(f"time  {case}", highlight=False, soft_wrap=True)
        return 0
    if not torch.cuda.is_available():
        console.print("[red]error:[/] no CUDA device visible to torch; the self-test needs a GPU")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability()
    arch = args.cuda_arch or f"{major}{minor}"
    gpu = current_gpu_label()
    started = time.perf_counter()
    try:
        build = build_plugins(out_dir=args.out, cuda_archs=arch, kernels_only=True, console=console)
    except PluginBuildError as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    console.print(
        f"built {build.kernels} for sm_{arch} in {time.perf_counter() - started:.1f}s"
        f"{' (cached)' if build.cached else ''} on {gpu}",
        highlight=False,
    )
    kernels = Kernels(build.kernels)
    generator = torch.Generator(device="cuda").manual_seed(0)

    results = [check_gold(kernels)] if aggregate else []
    for case in checks:
        try:
            results.append(check_case(kernels, case, generator))
        except RuntimeError as exc:
            results.append({"op": AGGREGATE_OP, **asdict(case), "error": str(exc), "ok": False})
        torch.cuda.empty_cache()
    if norm:
        results += selftest_aggregate_norm.run_checks(build.kernels, norm_checks, generator)
    if rsa:
        results += [{"op": "ResidualScoreAttention", **r}
                    for r in selftest_rsa.run_checks(build.kernels, rsa_checks, generator)]
    failures = [r for r in results if not r["ok"]]
    console.print(correctness_table(results, gpu))
    console.print(f"correctness on {gpu}: {len(results) - len(failures)}/{len(results)} passed", highlight=False)
    for r in failures:
        console.print(f"[red]FAIL[/] {r}", highlight=False)

    timings = []
    for case in perf:
        timings.append(time_case(kernels, case, generator, args.quick))
        torch.cuda.empty_cache()
    if timings:
        console.print(_perf_table(timings, gpu))
    for r in (t for t in timings if t["rows"] == 1):
        console.print(f"decode n={r['n']} D={r['d']} {r['dtype']}: {r['kernel_us']:.2f} us", highlight=False)
    rsa_timings = selftest_rsa.run_timings(build.kernels, rsa_perf, generator, args.quick, gpu_times_us)
    if rsa_timings:
        console.print(selftest_rsa.perf_table(rsa_timings, gpu))
    console.print(f"total {time.perf_counter() - started:.0f}s", highlight=False)

    if args.json:
        report = {
            "device": torch.cuda.get_device_name(),
            "gpu": gpu,
            "arch": arch,
            "library": str(build.kernels),
            "correctness": results,
            "performance": timings,
            "rsa_performance": rsa_timings,
            "failures": len(failures),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
