"""The self-test runner: build the kernels library for the visible GPU, run each selected op's checks and
timings, print plain-text tables, and say through the exit status whether every check passed.

``python -m attnres_export.plugins.selftest [--quick] [--op aggregate|aggregate_norm|rsa|all] [--json PATH]
[--dry-run]``. Exit 0: all checks pass; 1: a mismatch; 2: no GPU or the build failed.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnres_export.errors import PluginBuildError
from attnres_export.plugins.build import build_plugins
from attnres_export.plugins.selftest import aggregate, aggregate_norm, rsa
from attnres_export.plugins.selftest.common import OpSelftest, TimedOpSelftest, correctness_table, current_gpu_label
from attnres_export.plugins.selftest.table import render_text

OPS: dict[str, OpSelftest] = {test.name: test for test in (aggregate.SELFTEST, aggregate_norm.SELFTEST, rsa.SELFTEST)}
"""--op value -> the op's self-test, in the order they run."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnres_export.plugins.selftest",
                                     description="GPU self-test of the attnres kernels: correctness, then speed.")
    parser.add_argument("--quick", action="store_true", help="fewer shapes, bfloat16 timing only")
    parser.add_argument("--json", type=Path, help="write every result to this file")
    parser.add_argument("--dry-run", action="store_true", help="list the cases and exit (no GPU needed)")
    parser.add_argument("--cuda-arch", help="override the architecture (default: the detected GPU's)")
    parser.add_argument("--out", type=Path, help="build folder (default: the plugin cache)")
    parser.add_argument(
        "--op",
        choices=(*OPS, "all"),
        default="all",
        help="which kernel: AttnResAggregate, AttnResAggregateNorm (aggregate_norm, correctness only), "
        "ResidualScoreAttention (rsa) or all three (default)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, say: Callable[[str], None] = print) -> int:
    """Build, check, time; every line and table goes to ``say``; the exit status says whether every check passed."""
    args = _parse(argv)
    tests = list(OPS.values()) if args.op == "all" else [OPS[args.op]]
    timed = [t for t in tests if isinstance(t, TimedOpSelftest)]
    checks = {t.name: t.correctness_cases(args.quick) for t in tests}
    perf = {t.name: t.performance_cases(args.quick) for t in timed}
    if args.dry_run:
        for cases in checks.values():
            for case in cases:
                say(f"check {case}")
        for cases in perf.values():
            for case in cases:
                say(f"time  {case}")
        return 0
    if not torch.cuda.is_available():
        say("error: no CUDA device visible to torch; the self-test needs a GPU")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    major, minor = torch.cuda.get_device_capability()
    arch = args.cuda_arch or f"{major}{minor}"
    gpu = current_gpu_label()
    started = time.perf_counter()
    try:
        build = build_plugins(out_dir=args.out, cuda_archs=arch, kernels_only=True, status=say)
    except PluginBuildError as exc:
        say(f"error: {exc}")
        return 2
    say(f"built {build.kernels} for sm_{arch} in {time.perf_counter() - started:.1f}s"
        f"{' (cached)' if build.cached else ''} on {gpu}")
    generator = torch.Generator(device="cuda").manual_seed(0)

    results = [r for t in tests for r in t.run_checks(build.kernels, checks[t.name], generator)]
    failures = [r for r in results if not r["ok"]]
    say(render_text(correctness_table(results, gpu)))
    say(f"correctness on {gpu}: {len(results) - len(failures)}/{len(results)} passed")
    for r in failures:
        say(f"FAIL {r}")

    timings: dict[str, list[dict]] = {}
    for test in timed:
        rows = test.run_timings(build.kernels, perf[test.name], generator, args.quick)
        timings[test.timings_key] = rows
        if rows:
            say(render_text(test.perf_table(rows, gpu)))
        for line in test.notes(rows):
            say(line)
    say(f"total {time.perf_counter() - started:.0f}s")

    if args.json:
        report = {
            "device": torch.cuda.get_device_name(),
            "gpu": gpu,
            "arch": arch,
            "library": str(build.kernels),
            "correctness": results,
            **{t.timings_key: timings.get(t.timings_key, []) for t in OPS.values() if isinstance(t, TimedOpSelftest)},
            "failures": len(failures),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failures else 0
