"""Does the order models are loaded in move their speed? The same with-past ONNX (our decoder on ONNX Runtime) or
onnxruntime-genai folder loaded ``--copies`` times, timed in interleaved rounds (``rounds.round_order``), first all
in this one process (loaded in order: copy 0 first), then each in a worker process of its own (``rounds.Workers``,
what the decode benchmarks do). Every copy computes the same thing, so any ratio away from 1.0 is the load order's
(in one process) or noise (in workers). Greedy decode tokens/s over all rows after a prompt; each ratio is the median
of the rounds' paired ratios to copy 0, with their quartiles. Pin it to one core (``taskset -c 1``). Run from the
repository root:
    python benchmarks/load_order.py MODEL.with-past.onnx | GENAI_FOLDER [--copies 3] [--rounds 12] [--batch 1]
        [--prompt 32] [--new 32] [--threads 1]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rounds import InProcess, Workers, against_first, in_rounds


def make_runner(model: Path, threads: int) -> Callable[[np.ndarray, int], float]:
    """Decode tokens/s of one greedy generation: onnxruntime-genai for a folder, our decoder for an ONNX file."""
    if model.is_dir():
        from genai_decode import generator

        run = generator(model, threads)
        return lambda prompt, new: run(prompt.astype(np.int32), new)[1]
    from family_decode import make_runner as decoder_runner

    run = decoder_runner("onnxruntime", model, threads)
    return lambda prompt, new: prompt.shape[0] * (new - 1) / run(prompt, new)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=8192, help="prompt ids are drawn from [3, vocab)")
    args = parser.parse_args()
    prompt = np.random.default_rng(0).integers(3, args.vocab, (args.batch, args.prompt)).astype(np.int64)
    print("| runners | copy (load order) | tokens/s | vs copy 0 | quartiles |")
    print("|---|---:|---:|---:|---:|")
    for where, kind in (("one process", InProcess), ("a process each", Workers)):
        with kind(make_runner, [(args.model, args.threads)] * args.copies) as runners:
            rates = in_rounds(runners, args.rounds, prompt, args.new)
        for index, (rate, paired, low, high) in enumerate(against_first(rates)):
            print(f"| {where} | {index} | {rate:.1f} | {paired:.3f}x | {low:.3f}-{high:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
