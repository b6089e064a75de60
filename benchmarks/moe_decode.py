"""MoE feed-forward on ONNX Runtime CPU: tokens/s of decode steps and of prefills, the shipped graph (selected
experts only: ``expert_path="gather+grouped"``) against the all-experts graph (``"dense"``), in one interleaved run.

One ``MoEFeedForward`` (attnres_export/models/layers/moe.py) at random init, exported once per expert path with
``torch.onnx.export(dynamo=True)`` under dynamic batch and sequence (the project's optimizer passes after it);
each graph is checked against PyTorch float32 before it is timed. Default sizes keep Qwen3-30B-A3B's routing
(128 experts, top-8: E/k = 16) at a quarter of its widths (hidden 512, expert width 192). Run from the repository
root:
    python benchmarks/moe_decode.py [--router softmax|sigmoid] [--repeats 5] [--threads 1] [--prefill 16,128]
Columns: ``gather+grouped`` is the one graph that serves prefill and decode (gather on one token, grouped above);
``gather``, ``grouped`` and ``dense`` are each form alone. In each round every graph runs in turn on the same
input, so load from other processes hits them alike; figures are medians over the rounds, by wall time and by
this process's CPU time (a gap between the two tables is a neighbour's load).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from attnres_export.exporter.optimize import optimize_exported
from attnres_export.models.layers.moe import ROUTERS, MoEConfig, MoEFeedForward

SHIPPED = "gather+grouped"
PATHS = (SHIPPED, "gather", "grouped", "dense")


def export(module: MoEFeedForward, hidden: int, path: Path) -> float:
    """Export ``module`` with dynamic batch and sequence to ``path``; the seconds it took."""
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=8192)
    start = time.perf_counter()
    program = torch.onnx.export(module, (torch.randn(2, 3, hidden),), dynamic_shapes=({0: batch, 1: seq},),
                                dynamo=True, optimize=False, verbose=False)
    optimize_exported(program.model)
    program.save(str(path))
    return time.perf_counter() - start


def time_run(session: onnxruntime.InferenceSession, feed: dict[str, np.ndarray], min_s: float) -> tuple[float, float]:
    """(wall s, CPU s) per run, averaged over as many runs as fit in ``min_s`` (at least 3)."""
    runs, wall, cpu = 0, time.perf_counter(), time.process_time()
    while runs < 3 or time.perf_counter() - wall < min_s:
        session.run(None, feed)
        runs += 1
    return (time.perf_counter() - wall) / runs, (time.process_time() - cpu) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--router", choices=("softmax", "sigmoid"), default="softmax")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--inner", type=int, default=192, help="moe_intermediate_size")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (1: on a shared machine a spinning pool also times its neighbours)")
    parser.add_argument("--decode-batches", default="1,2,4,8,16")
    parser.add_argument("--prefill", default="16,128", help="prefill lengths, batch 1")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="timing window of each graph per round")
    args = parser.parse_args()
    grouped = {"n_group": 8, "topk_group": 4, "n_shared_experts": 1, "routed_scaling_factor": 2.5}
    config = MoEConfig(args.experts, args.top_k, args.inner, norm_topk_prob=True, scoring_func=args.router,
                       topk_method=ROUTERS[args.router],
                       **(grouped if args.router == "sigmoid" else {}))
    torch.manual_seed(0)
    reference = MoEFeedForward(config, args.hidden).eval()
    if args.router == "sigmoid":
        reference.gate.e_score_correction_bias.normal_(std=0.02)
    workloads = [(f"decode step, batch {b}", b, 1) for b in map(int, args.decode_batches.split(","))]
    workloads += [(f"prefill {t} tokens, batch 1", 1, t) for t in map(int, args.prefill.split(","))]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    rng = np.random.default_rng(0)
    inputs = {name: rng.standard_normal((b, t, args.hidden)).astype(np.float32) for name, b, t in workloads}
    with tempfile.TemporaryDirectory(prefix="attnres-moe-") as tmp:
        sessions, export_s = {}, {}
        for path in PATHS:
            module = MoEFeedForward(config, args.hidden, path).eval()
            module.load_state_dict(reference.state_dict())
            onnx_path = Path(tmp) / f"moe.{path.replace('+', '-')}.onnx"
            export_s[path] = export(module, args.hidden, onnx_path)
            sessions[path] = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        with torch.no_grad():
            for name, x in inputs.items():
                expected = reference(torch.from_numpy(x)).numpy()
                for path, session in sessions.items():
                    got = session.run(None, {"x": x})[0]
                    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
                    if error > 1e-5:
                        raise SystemExit(f"{path} graph misses PyTorch on {name}: rel L2 {error:.2e}")
        walls: dict[tuple[str, str], list[float]] = {(n, p): [] for n, _, _ in workloads for p in PATHS}
        cpus: dict[tuple[str, str], list[float]] = {(n, p): [] for n, _, _ in workloads for p in PATHS}
        for _ in range(args.repeats):
            for name, _, _ in workloads:
                for path, session in sessions.items():
                    wall, cpu = time_run(session, {"x": inputs[name]}, args.min_seconds)
                    walls[(name, path)].append(wall)
                    cpus[(name, path)].append(cpu)
    print(f"# MoE feed-forward, router {args.router}: hidden {args.hidden}, expert width {args.inner}, "
          f"{args.experts} experts, top-{args.top_k}" + (", groups 8/4, 1 shared expert" if args.router == "sigmoid"
                                                         else ""))
    print(f"# ONNX Runtime {onnxruntime.__version__} CPU, {args.threads} threads; torch {torch.__version__}; "
          f"{platform.processor() or platform.machine()}; medians of {args.repeats} rounds")
    print("# export s: " + ", ".join(f"{p} {export_s[p]:.1f}" for p in PATHS))
    for clock, times in (("wall", walls), ("CPU time of this process", cpus)):
        print(f"\ntokens/s by {clock}")
        header = ["workload", *PATHS, "dense time / shipped"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for name, b, t in workloads:
            median = {p: statistics.median(times[(name, p)]) for p in PATHS}
            rates = [f"{b * t / median[p]:,.0f}" for p in PATHS]
            print(f"| {name} | " + " | ".join(rates) + f" | {median['dense'] / median[SHIPPED]:.1f}x |")

if __name__ == "__main__":
    main()
