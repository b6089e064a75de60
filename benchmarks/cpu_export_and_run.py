"""CPU figures for the exporter: export time, ONNX size, and the latency of PyTorch eager, ONNX Runtime on the
``portable`` artifact and ONNX Runtime on the ``tensorrt`` artifact with the NumPy reference op, in one run.

Model: 12 layers, d_model 512, Block AttnRes (S = 4), batch 4 x 128 tokens. Run from the repository root:
    python benchmarks/cpu_export_and_run.py [--repeats 20] [--threads 2] [--layers 12] [--block-size 4]
Figures are medians of rounds in which the backends run in turn; ratios are against PyTorch eager in the same
run (machines here are shared). torch and ONNX Runtime use the same number of intra-op threads, and CPU time
(this process, all threads) is reported beside wall time, so that a neighbour's load shows as a gap between them.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from rich.console import Console
from rich.table import Table

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.backends.pytorch.runner import TorchRunner
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.targets import convert
from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example

CONFIG = AttnResLMConfig(vocab_size=8192, d_model=512, n_layers=12, n_heads=8, d_ff=1408, block_size=4, max_seq_len=512)
BATCH, SEQ = 4, 128


def interleaved_medians(calls: dict[str, Callable[[], object]], repeats: int,
                        warmup: int = 2) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per call, running the calls in turn so that load from other processes hits all
    alike."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
            for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of torch and ONNX Runtime alike")
    parser.add_argument("--layers", type=int, default=CONFIG.n_layers)
    parser.add_argument("--block-size", type=int, default=CONFIG.block_size, help="0 = Full AttnRes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = AttnResLMConfig(**{**CONFIG.to_dict(), "n_layers": args.layers, "block_size": args.block_size})
    console = Console()

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "bench.pt"
        model = make_example(config, seed=0)
        save_checkpoint(model, config, ckpt)
        opts = ExportOptions(ckpt, Path(tmp) / "bench.onnx", batch=DimRange(1, BATCH, 8),
                             seq=DimRange(1, SEQ, 512), check=False)
        with console.status("exporting (tensorrt target)"):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = export_checkpoint(opts)
            export_s, export_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        fused = onnx.load(str(result.path))
        portable = convert(fused, "portable")
        portable_path = Path(tmp) / "bench.portable.onnx"
        onnx.save_model(portable, str(portable_path))
        sizes = {"tensorrt": result.path.stat().st_size, "portable": portable_path.stat().st_size}

        feeds = model.random_inputs(BATCH, SEQ, np.random.default_rng(0))
        runners = {
            "PyTorch eager (float32)": TorchRunner(model, list(model.output_names)),
            "ONNX Runtime, portable": OnnxRuntimeRunner(portable, threads=args.threads),
            "ONNX Runtime, tensorrt + NumPy reference op": OnnxRuntimeRunner(fused, threads=args.threads),
        }
        for runner in runners.values():
            runner.activate()
        with console.status(f"timing {len(runners)} backends in turn, {args.repeats} rounds"):
            latencies = interleaved_medians({name: (lambda r=r: r.infer(feeds)) for name, r in runners.items()},
                                            args.repeats)
        for runner in runners.values():
            runner.deactivate()

    console.print(f"model: {config.n_layers} layers, d_model {config.d_model}, block size {config.block_size} "
                  f"(0 = Full), vocab {config.vocab_size}, {result.fused_nodes} aggregations; batch {BATCH} x {SEQ} "
                  f"tokens; {platform.processor() or platform.machine()}, {args.threads} threads for torch and ONNX "
                  f"Runtime, torch {torch.__version__}")
    console.print(f"export (tensorrt target, incl. tracing and onnx.checker): {export_s:.1f} s wall, "
                  f"{export_cpu_s:.1f} s CPU; ONNX size: tensorrt {sizes['tensorrt'] / 1e6:.1f} MB, "
                  f"portable {sizes['portable'] / 1e6:.1f} MB")
    table = Table(title=f"median latency over {args.repeats} interleaved rounds")
    for column in ("backend", "median ms", "CPU ms", "vs PyTorch (wall)"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    base = latencies["PyTorch eager (float32)"][0]
    for name, (wall, cpu) in latencies.items():
        table.add_row(name, f"{wall * 1e3:.1f}", f"{cpu * 1e3:.1f}", f"{wall / base:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
