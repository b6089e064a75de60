"""Assembled export time against depth for a Kimi K3-architecture body, in one run: a Kimi Linear folder with K3's
AttnRes keys (``attn_res_block_size``) at 12 and at 93 layers (K3's depth) of the same small width, exported with
``attnres-export`` (assembled from the model's plan, the default; no parity check), and the 12-layer one traced whole
(``--trace-whole``) for reference. The goal (issue 25): 93 layers at most 2x the 12-layer export.

Models: ``attnres example --arch kimi-linear`` folders (hidden 64, KDA 4 heads x 16, every fourth layer NoPE
latent attention, layer 0 a dense feed-forward and the rest MoE with 8 experts, top-2, one shared expert),
``attn_res_block_size`` 8, dynamic batch 1..8 and sequence 1..512. Every export runs in a child process of its own
(2 torch threads), timed after a warm-up export of a 2-layer folder of the same kind in that child. Wall and CPU time
are both printed (the machine is shared: compare the ratios of one run). Run from the repository root:
    python benchmarks/export_depth_kimi.py               # one round
    python benchmarks/export_depth_kimi.py --no-whole    # without the 12-layer whole-model trace
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnres_export.models.registry import architecture

ROOT = Path(__file__).resolve().parent.parent
DEPTHS = (12, 93)
BLOCK = 8
GOAL = 2.0
"""Assembled 93 layers / assembled 12 layers, at most."""

CHILD = r"""
import json, sys, time
from pathlib import Path
args = json.loads(sys.argv[1])
import torch
torch.set_num_threads(args["threads"])
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions

def run(folder, out, trace_whole):
    marks = []
    opts = ExportOptions(Path(folder), Path(out), batch=DimRange(1, 1, 8), seq=DimRange(1, 64, 512), check=False,
                         trace_whole=trace_whole)
    start = (time.perf_counter(), time.process_time())
    export_checkpoint(opts, status=lambda text: marks.append((time.perf_counter(), time.process_time(), text)))
    end = (time.perf_counter(), time.process_time())
    phases = [(text, nxt[0] - wall, nxt[1] - cpu)
              for (wall, cpu, text), nxt in zip(marks, [m[:2] for m in marks[1:]] + [end])]
    return end[0] - start[0], end[1] - start[1], phases

cold = run(args["warmup"], args["out"] + ".warmup.onnx", args["trace_whole"])
wall, cpu, phases = run(args["folder"], args["out"], args["trace_whole"])
print(json.dumps({"wall": wall, "cpu": cpu, "phases": phases, "cold_warmup": cold[0]}))
"""

PHASES = {"loading": "load (read the folder, build the model)", "tracing": "trace",
          "assembling": "assemble", "writing": "write weights (to the staging folder)",
          "stamping": "stamp and convert", "checking and writing": "publish (`onnx.checker`, one file)"}


def child(folder: Path, warmup: Path, out: Path, trace_whole: bool, threads: int) -> dict:
    payload = json.dumps({"folder": str(folder), "warmup": str(warmup), "out": str(out), "threads": threads,
                          "trace_whole": trace_whole})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", CHILD, payload], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        sys.exit(f"an export failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def phase_table(results: dict[str, dict]) -> Table:
    table = Table(title="phases (wall s / CPU s)")
    table.add_column("phase")
    for name in results:
        table.add_column(name, justify="right")
    for prefix, label in PHASES.items():
        cells = []
        for result in results.values():
            spent = [(w, c) for text, w, c in result["phases"] if text.startswith(prefix)]
            cells.append(f"{sum(w for w, _ in spent):.2f} / {sum(c for _, c in spent):.2f}" if spent else "")
        table.add_row(label, *cells)
    table.add_row("total", *(f"{r['wall']:.2f} / {r['cpu']:.2f}" for r in results.values()))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-whole", action="store_true", help="skip the 12-layer whole-model trace")
    args = parser.parse_args()
    console = Console()
    console.print(f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, load average "
                  f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    arch = architecture("kimi-linear")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folders = {layers: arch.write_example_folder("kimi_linear", root / f"k3-{layers}", layers, BLOCK, layers)[0]
                   for layers in (2, *DEPTHS)}
        runs = [(f"assembled {layers}", layers, False) for layers in DEPTHS]
        if not args.no_whole:
            runs.append(("whole 12", 12, True))
        results = {}
        for name, layers, whole in runs:
            console.print(f"exporting {name} ...")
            results[name] = child(folders[layers], folders[2], root / f"{name.replace(' ', '-')}.onnx", whole,
                                  args.threads)
            console.print(f"  {results[name]['wall']:.2f} s wall, {results[name]['cpu']:.2f} s CPU")
    console.print(f"load average after the run {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    console.print(phase_table(results))
    ratio = results["assembled 93"]["wall"] / results["assembled 12"]["wall"]
    cpu_ratio = results["assembled 93"]["cpu"] / results["assembled 12"]["cpu"]
    console.print(f"assembled 93 / 12 layers: {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU (goal at most {GOAL}x: "
                  f"{'met' if ratio <= GOAL else 'not met'})")
    if "whole 12" in results:
        whole = results["whole 12"]["wall"] / results["assembled 12"]["wall"]
        console.print(f"whole-model trace / assembled, 12 layers: {whole:.2f}x wall")
    cold = ", ".join(f"{name} {result['cold_warmup']:.1f}" for name, result in results.items())
    console.print(f"cold warm-up exports (wall s): {cold}")


if __name__ == "__main__":
    main()
