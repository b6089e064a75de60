"""CPU decode figures: prefill latency and decode tokens/s of PyTorch eager (with its KV cache) against ONNX Runtime
CPU on the with-past ONNX (``attnres-export MODEL --with-past --target portable``), in one interleaved run.

Model: 12 layers, d_model 512, 8 heads, d_ff 1408, vocab 8192, Block AttnRes S = 4; prompt of 128 tokens, then
greedy decode of 32 tokens; batch 1 and 8. Run from the repository root:
    python benchmarks/cpu_decode.py [--repeats 5] [--threads 2] [--prompt 128] [--new 32]
torch and ONNX Runtime use the same number of intra-op threads, each backend in a worker process of its own
(``rounds.Workers``: models loaded into one process move each other's speed). In each round the backends run in
turn per batch, their order alternating between rounds, so load from other processes hits both alike; figures are
medians over the rounds, and the CPU time of the backend's process is reported beside wall time (a gap between them
is a neighbour's load).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from rounds import Workers, round_order

from attnres_export.decode.generate import Decoder, onnx_decoder, torch_decoder
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example

CONFIG = AttnResLMConfig(vocab_size=8192, d_model=512, n_layers=12, n_heads=8, d_ff=1408, block_size=4, max_seq_len=512)


def run_once(decoder: Decoder, prompt: np.ndarray, new: int) -> tuple[float, float, float, float, list[int]]:
    """(prefill wall s, prefill CPU s, decode wall s, decode CPU s, first row's tokens) of one greedy generation."""
    b, n = prompt.shape
    wall, cpu = time.perf_counter(), time.process_time()
    logits, past = decoder.step(prompt, np.ones((b, n), np.int64), np.broadcast_to(np.arange(n), (b, n)).copy(),
                                decoder.empty_past(b))
    token = logits[:, -1].argmax(-1)
    prefill = (time.perf_counter() - wall, time.process_time() - cpu)
    tokens = [int(token[0])]
    wall, cpu = time.perf_counter(), time.process_time()
    for pos in range(n, n + new - 1):
        logits, past = decoder.step(token[:, None].astype(np.int64), np.ones((b, pos + 1), np.int64),
                                    np.full((b, 1), pos, np.int64), past)
        token = logits[:, -1].argmax(-1)
        tokens.append(int(token[0]))
    return (*prefill, time.perf_counter() - wall, time.process_time() - cpu, tokens)


def make_runner(kind: str, path: str, threads: int) -> Callable[[np.ndarray, int], tuple]:
    """``run_once`` on one backend's decoder, built in its own worker process (``rounds.Workers``): PyTorch eager on
    the checkpoint (``kind`` "torch") or ONNX Runtime on the with-past ONNX."""
    if kind == "torch":
        from attnres_export.models import load_checkpoint

        torch.set_num_threads(threads)
        decoder = torch_decoder(load_checkpoint(Path(path))[0])
    else:
        decoder = onnx_decoder(Path(path), threads=threads)
    return partial(run_once, decoder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of torch and ONNX Runtime alike")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="attnres-decode-") as tmp:
        ckpt = Path(tmp) / "model.pt"
        save_checkpoint(make_example(CONFIG, 0), CONFIG, ckpt)
        start = time.perf_counter()
        total = args.prompt + args.new
        result = export_checkpoint(ExportOptions(
            ckpt, output=Path(tmp) / "model.with-past.portable.onnx", target="portable", with_past=True,
            batch=DimRange(1, 1, max(batches)), seq=DimRange(1, 1, args.prompt),
            past=DimRange(0, args.prompt, total)))
        export_s = time.perf_counter() - start
        if not result.report.ok:
            raise SystemExit("the with-past export missed its parity bar")
        specs = {"PyTorch eager (KV cache)": ("torch", str(ckpt), args.threads),
                 "ONNX Runtime CPU, portable with past": ("onnx", str(result.path), args.threads)}
        rng = np.random.default_rng(0)
        prompts = {b: rng.integers(0, CONFIG.vocab_size, size=(b, args.prompt), dtype=np.int64) for b in batches}
        times: dict[tuple[int, str], list[tuple[float, ...]]] = {(b, n): [] for b in batches for n in specs}
        with Workers(make_runner, list(specs.values())) as runners:
            for b in batches:  # warm-up, and the greedy tokens of the two backends must agree
                tokens = {name: runners(i, prompts[b], 4)[4] for i, name in enumerate(specs)}
                if len(set(map(tuple, tokens.values()))) != 1:
                    print(f"warning: batch {b}: greedy tokens differ between backends: {tokens}")
            for round_ in range(args.repeats):
                for b in batches:
                    for i in round_order(len(specs), round_):
                        times[(b, list(specs)[i])].append(runners(i, prompts[b], args.new)[:4])
    print(f"# {platform.machine()}, {torch.get_num_threads()} torch threads / {args.threads} ORT intra-op threads, "
          f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; export {export_s:.1f} s; "
          f"prompt {args.prompt}, {args.new} new tokens, {args.repeats} interleaved rounds, medians")
    print("| batch | backend | prefill ms (CPU ms) | decode tokens/s (CPU-time tokens/s) | decode vs eager |")
    print("|---:|---|---:|---:|---:|")
    eager_rate: dict[int, float] = {}
    for (b, name), values in times.items():
        prefill, prefill_cpu, decode, decode_cpu = (statistics.median(v[i] for v in values) for i in range(4))
        rate, cpu_rate = b * (args.new - 1) / decode, b * (args.new - 1) / decode_cpu
        eager_rate.setdefault(b, rate)
        print(f"| {b} | {name} | {prefill * 1e3:.1f} ({prefill_cpu * 1e3:.1f}) | {rate:.1f} ({cpu_rate:.1f}) | "
              f"{rate / eager_rate[b]:.2f}x |")


if __name__ == "__main__":
    main()
