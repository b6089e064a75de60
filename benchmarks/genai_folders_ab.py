"""Decode tokens/s of onnxruntime-genai folders against the first one, on one prompt, rounds interleaved.

For comparing variants of one export (the same weights written two ways) where ``genai_decode.py``'s whole matrix
is more than needed: each round runs every folder in turn on the same prompt (greedy, the folders' own
``genai_config.json``), rotated every two rounds and reversed every other round (``rounds.round_order``: with
three folders, six rounds run all six orders), so load from other processes and a folder's place in the round hit
them alike; figures are medians over the rounds. The ratio to the first folder is paired: each round's
tokens/s over the first folder's in that round, their median and quartiles over the rounds (a spread that holds 1.0
says the two are not told apart by this run). Each folder runs in a process of its own (``rounds.Workers``: in one
process the order models are loaded in moves their speed; ``--same-process`` loads them all here, in order, to show
it). Pin it to one core for steadier figures (``taskset -c 1``; the workers inherit it). The prompt's token ids are
drawn below ``--vocab``. Run from the repository root:
    python benchmarks/genai_folders_ab.py BASE OTHER [OTHER ...] [--batches 1,8] [--prompt 32] [--new 96]
        [--rounds 15] [--threads 1] [--vocab 32000] [--same-process]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from genai_decode import generator
from rounds import InProcess, Workers, against_first, in_rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="onnxruntime-genai folders; the first is the base")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (0: its default)")
    parser.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn from [3, vocab)")
    parser.add_argument("--same-process", action="store_true",
                        help="load every folder in this process, in order (what the load order does to speed)")
    args = parser.parse_args()
    if len(args.folders) < 2:
        parser.error("give a base folder and at least one other")
    names = [folder.name for folder in args.folders]
    width = max(len(n) for n in names)
    print(f"{'folder':<{width}} {'batch':>5} {'tokens/s':>10} {'vs base':>8} {'quartiles':>15}")
    kind = InProcess if args.same_process else Workers
    with kind(generator, [(folder, args.threads or None) for folder in args.folders]) as runners:
        for batch in [int(b) for b in args.batches.split(",")]:
            prompt = np.random.default_rng([batch, args.prompt]).integers(3, args.vocab, (batch, args.prompt))
            prompt = prompt.astype(np.int32)
            rates = [[r[1] for r in results] for results in in_rounds(runners, args.rounds, prompt, args.new)]
            for name, (rate, paired, low, high) in zip(names, against_first(rates), strict=True):
                print(f"{name:<{width}} {batch:>5} {rate:>10.1f} {paired:>7.3f}x {low:>6.3f}-{high:.3f}x", flush=True)


if __name__ == "__main__":
    main()
