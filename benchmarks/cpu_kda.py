"""CPU figures for one Kimi Delta Attention layer: export time, and the latency of PyTorch eager, ONNX Runtime on
the ``portable`` artifact (the Scan decomposition) and ONNX Runtime on the ``tensorrt`` artifact with the NumPy
reference op, for a prefill of several lengths and the single-token step, in one run.

Layer: Kimi-Linear-48B's KDA sizes (hidden 2304, 32 heads of 128), batch 1, float32. From the repository root:
    python benchmarks/cpu_kda.py [--tokens 1 64 512] [--repeats 3] [--threads 1] [--heads 32] [--hidden 2304]
(docs/models.md#kimi-delta-attention has the figures, and those of the chunked decomposition it was measured
against at commit 617a03e, ``--form chunk16|chunk32|chunk64`` there.) Figures are
medians of rounds in which the backends run in turn; CPU time (this process, all threads) is reported beside wall
time, so that a neighbour's load shows as a gap between them.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.dims import DimRange
from attnres_export.exporter.to_onnx import export_module
from attnres_export.graphs.targets import convert
from attnres_export.models.kimi import KdaConfig, KdaState, KimiDeltaAttention

STATE_NAMES = ("recurrent_state", "conv_state_q", "conv_state_k", "conv_state_v")


class FlatState(nn.Module):
    def __init__(self, layer: KimiDeltaAttention) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, recurrent_state, conv_state_q, conv_state_k, conv_state_v):
        out, state = self.layer(hidden_states, KdaState(recurrent_state, conv_state_q, conv_state_k, conv_state_v))
        return out, *state


def medians(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call, the calls run in turn after one warm-up round."""
    for call in calls.values():
        call()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of torch and ONNX Runtime alike (1 on a shared machine)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2304)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = KdaConfig(hidden_size=args.hidden, num_heads=args.heads, head_dim=args.head_dim, conv_size=4,
                    norm_eps=1e-5, layer_types=("linear_attention",))
    torch.manual_seed(0)
    layer = KimiDeltaAttention(cfg)
    with torch.no_grad():
        layer.A_log.uniform_(0.0, 2.7)
        layer.dt_bias.normal_()
    model = FlatState(layer).eval()
    example = {"hidden_states": torch.randn(1, 5, args.hidden), **dict(zip(STATE_NAMES, layer.initial_state(1),
                                                                           strict=True))}
    sizes = DimRange(1, 64, 8192)
    dynamic = {name: {0: ("batch", sizes)} for name in STATE_NAMES}
    dynamic["hidden_states"] = {0: ("batch", sizes), 1: ("seq", sizes)}
    outputs = ["out", *(f"{n}_out" for n in STATE_NAMES)]
    start = time.perf_counter()
    traced = ir.to_proto(export_module(model, example, dynamic, outputs, opset=18))
    exported = time.perf_counter() - start
    start = time.perf_counter()
    portable, fused = convert(traced, "portable"), convert(traced, "tensorrt")
    converted = time.perf_counter() - start
    print(f"layer: hidden {args.hidden}, {args.heads} heads x {args.head_dim}; threads {args.threads}")
    print(f"export (torch.onnx, dynamic batch/seq): {exported:.1f} s; convert to portable + tensorrt: "
          f"{converted:.2f} s; nodes: tensorrt {len(fused.graph.node)}, portable {len(portable.graph.node)}")
    runners = {"onnxruntime portable": OnnxRuntimeRunner(portable, threads=args.threads),
               "onnxruntime tensorrt+ref-op": OnnxRuntimeRunner(fused, threads=args.threads)}
    for runner in runners.values():
        runner.activate()
    try:
        for tokens in args.tokens:
            x = torch.randn(1, tokens, args.hidden)
            state = layer.initial_state(1)
            feeds = {"hidden_states": x.numpy(), **{n: t.numpy() for n, t in zip(STATE_NAMES, state, strict=True)}}
            with torch.no_grad():
                want = model(x, *state)[0].numpy()
            errors = {name: np.linalg.norm(r.infer(feeds)["out"] - want) / np.linalg.norm(want)
                      for name, r in runners.items()}
            calls: dict[str, Callable[[], object]] = {"pytorch eager": functools.partial(model, x, *state)}
            calls |= {name: functools.partial(r.infer, feeds) for name, r in runners.items()}
            with torch.no_grad():
                timed = medians(calls, args.repeats)
            for name, (wall, cpu) in timed.items():
                error = f"  rel L2 vs PyTorch {errors[name]:.1e}" if name in errors else ""
                print(f"T={tokens:5d}  {name:28s} {wall * 1e3:9.1f} ms wall {cpu * 1e3:9.1f} ms CPU{error}")
    finally:
        for runner in runners.values():
            runner.deactivate()


if __name__ == "__main__":
    main()
