"""Export time against depth, in one run: ``attnres-export`` assembling the graph from the model's plan (each kind of
layer traced once, the default), the same export tracing the whole model (``--trace-whole``), and
``torch.onnx.export(..., dynamo=True)`` of transformers' ``LlamaForCausalLM`` of the same size, side by side.

Models: d_model 512, 8 heads, d_ff 1408, vocab 8192, max_seq_len 512; 12 layers with Block AttnRes (S = 4) and 48
layers with Full AttnRes (the configurations of docs/benchmarks.md's earlier export figures), dynamic batch 1..8 and
sequence 1..512. Every export runs in a child process of its own (2 torch threads), timed after a warm-up export of a
one-layer model of the same kind in that child, so that a figure is the exporter's and not the imports' or torch's
first-call setup; the child's first (cold) export of the warm-up model is shown too. ``attnres-export`` runs without
its parity check for the goals (the check is the same for both paths; the phase table shows it). Wall and CPU time
are both printed: the machines here are shared, and CPU time is the steadier of the two.
Run from the repository root:
    python benchmarks/export_depth.py                  # one round
    python benchmarks/export_depth.py --rounds 3       # medians of three interleaved rounds
    python benchmarks/export_depth.py --skip-whole-48  # without the longest run (the 48-layer whole-model trace)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"vocab_size": 8192, "d_model": 512, "n_heads": 8, "d_ff": 1408, "max_seq_len": 512}
DEPTHS = {12: 4, 48: 0}
"""Layers -> block size (0 = Full AttnRes)."""
GOALS = {"whole_over_assembled_12": 4.0, "assembled_48_over_12": 1.3, "llama_over_assembled_12": 5.0}

CHILD = r"""
import json, sys, time
args = json.loads(sys.argv[1])
import torch
torch.set_num_threads(args["threads"])

def attnres(checkpoint, out, trace_whole, check):
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions
    marks = []
    opts = ExportOptions(__import__("pathlib").Path(checkpoint), __import__("pathlib").Path(out),
                         batch=DimRange(1, 1, 8), seq=DimRange(1, 64, 512), check=check, trace_whole=trace_whole)
    start = (time.perf_counter(), time.process_time())
    export_checkpoint(opts, status=lambda text: marks.append((time.perf_counter(), time.process_time(), text)))
    end = (time.perf_counter(), time.process_time())
    phases = [(text, (nxt[0] - wall), (nxt[1] - cpu))
              for (wall, cpu, text), nxt in zip(marks, [m[:2] for m in marks[1:]] + [end])]
    return end[0] - start[0], end[1] - start[1], phases

def llama(layers, out):
    import contextlib, io, logging, warnings
    from transformers import LlamaConfig, LlamaForCausalLM
    sizes = args["sizes"]
    cfg = LlamaConfig(vocab_size=sizes["vocab_size"], hidden_size=sizes["d_model"],
                      intermediate_size=sizes["d_ff"], num_hidden_layers=layers,
                      num_attention_heads=sizes["n_heads"], num_key_value_heads=sizes["n_heads"],
                      max_position_embeddings=sizes["max_seq_len"], use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.zeros(2, 64, dtype=torch.int64)
    dims = {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=1, max=sizes["max_seq_len"])}
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    start = (time.perf_counter(), time.process_time())
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (ids,), dynamo=True, dynamic_shapes=(dims,), input_names=["input_ids"],
                                    output_names=["logits"])
        program.save(out)
    return time.perf_counter() - start[0], time.process_time() - start[1], []

def run(spec, out):
    if spec["kind"] == "llama":
        return llama(spec["layers"], out)
    return attnres(spec["checkpoint"], out, spec["trace_whole"], spec["check"])

cold = run(args["warmup"], args["out"] + ".warmup.onnx")
wall, cpu, phases = run(args["measured"], args["out"])
print(json.dumps({"wall": wall, "cpu": cpu, "phases": phases, "cold_warmup": cold[0]}))
"""


def child(measured: dict, warmup: dict, out: Path, threads: int) -> dict:
    payload = json.dumps({"measured": measured, "warmup": warmup, "out": str(out), "threads": threads,
                          "sizes": SIZES})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", CHILD, payload], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode:
        sys.exit(f"an export failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_checkpoints(folder: Path) -> dict[str, Path]:
    paths = {}
    for layers, block in [*DEPTHS.items(), (1, 0)]:
        cfg = AttnResLMConfig(**SIZES, n_layers=layers, block_size=block)
        paths[f"attnres-{layers}"] = folder / f"attnres-{layers}.pt"
        save_checkpoint(make_example(cfg, seed=layers), cfg, paths[f"attnres-{layers}"])
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-whole-48", action="store_true", help="leave out the 48-layer whole-model trace")
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with console.status("writing the checkpoints"):
            ckpt = write_checkpoints(folder)

        def attnres(layers: int, whole: bool, check: bool = False) -> tuple[dict, dict]:
            spec = {"kind": "attnres", "trace_whole": whole}
            return ({**spec, "check": check, "checkpoint": str(ckpt[f"attnres-{layers}"])},
                    {**spec, "check": False, "checkpoint": str(ckpt["attnres-1"])})

        runs = {
            "assembled 12": attnres(12, False), "whole 12": attnres(12, True),
            "assembled 48": attnres(48, False), "whole 48": attnres(48, True),
            "llama 12": ({"kind": "llama", "layers": 12}, {"kind": "llama", "layers": 1}),
        }
        if args.skip_whole_48:
            del runs["whole 48"]
        results: dict[str, list[dict]] = {name: [] for name in runs}
        for round_ in range(args.rounds):
            for name, (measured, warmup) in runs.items():
                with console.status(f"round {round_ + 1}/{args.rounds}: {name}"):
                    results[name].append(child(measured, warmup, folder / f"{name.replace(' ', '-')}.onnx",
                                               args.threads))
        with console.status("phases with the parity check: assembled 12, whole 12"):
            phased = {name: child(*attnres(12, name == "whole 12", check=True), folder / "phased.onnx", args.threads)
                      for name in ("assembled 12", "whole 12")}
        sizes = {name: sum(p.stat().st_size for p in folder.glob(f"{name.replace(' ', '-')}.onnx*")
                           if ".warmup." not in p.name) for name in runs}
    report(console, results, phased, sizes, args)


def report(console: Console, results: dict[str, list[dict]], phased: dict[str, dict], sizes: dict[str, int],
           args) -> None:
    med = {name: (statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs),
                  statistics.median(r["cold_warmup"] for r in rs)) for name, rs in results.items()}
    table = Table(title=f"export time, d512 ({platform.processor() or platform.machine()}, {args.threads} threads, "
                        f"torch {torch.__version__}, median of {args.rounds} round(s))")
    for column in ("export", "model", "wall s", "CPU s", "cold warm-up wall s", "ONNX MB"):
        table.add_column(column, justify="left" if column in ("export", "model") else "right")
    models = {"12": "12 layers, Block S=4", "48": "48 layers, Full"}
    for name, (wall, cpu, cold) in med.items():
        what = {"assembled": "attnres-export (assembled)", "whole": "attnres-export --trace-whole",
                "llama": "torch.onnx.export(dynamo=True), LlamaForCausalLM"}[name.split()[0]]
        model = models[name.split()[1]] if name.split()[0] != "llama" else "12 layers"
        table.add_row(what, model, f"{wall:.1f}", f"{cpu:.1f}", f"{cold:.1f}", f"{sizes[name] / 1e6:.1f}")
    console.print(table)
    ratios = Table(title="goals")
    for column in ("ratio", "wall", "CPU", "goal", "met (wall)"):
        ratios.add_column(column, justify="left" if column == "ratio" else "right")
    pairs = {"whole_over_assembled_12": ("whole 12", "assembled 12", ">="),
             "assembled_48_over_12": ("assembled 48", "assembled 12", "<="),
             "llama_over_assembled_12": ("llama 12", "assembled 12", ">=")}
    for goal, (top, bottom, sense) in pairs.items():
        wall, cpu = med[top][0] / med[bottom][0], med[top][1] / med[bottom][1]
        met = wall >= GOALS[goal] if sense == ">=" else wall <= GOALS[goal]
        ratios.add_row(f"{top} / {bottom}", f"{wall:.2f}x", f"{cpu:.2f}x", f"{sense} {GOALS[goal]}x",
                       "yes" if met else "no")
    if "whole 48" in med:
        ratios.add_row("whole 48 / whole 12", f"{med['whole 48'][0] / med['whole 12'][0]:.2f}x",
                       f"{med['whole 48'][1] / med['whole 12'][1]:.2f}x", "", "")
    console.print(ratios)
    phases = Table(title="phases of one 12-layer export with its parity check (wall s / CPU s)")
    phases.add_column("phase")
    for name in phased:
        phases.add_column(name, justify="right")
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    for name, result in phased.items():
        for text, wall, cpu in result["phases"]:
            label = _phase(text)
            before = rows.setdefault(label, {}).get(name, (0.0, 0.0))
            rows[label][name] = (before[0] + wall, before[1] + cpu)
    for label, by_run in rows.items():
        phases.add_row(label, *(f"{by_run[n][0]:.2f} / {by_run[n][1]:.2f}" if n in by_run else "" for n in phased))
    phases.add_row("total", *(f"{r['wall']:.2f} / {r['cpu']:.2f}" for r in phased.values()))
    console.print(phases)
    write = rows.get("write weights", {}).get("assembled 12")
    if write:
        console.print(f"floor: writing the weights ({sizes['assembled 12'] / 1e6:.0f} MB) took {write[0]:.2f} s wall "
                      f"({sizes['assembled 12'] / 1e6 / write[0]:.0f} MB/s) of the assembled export")


def _phase(status: str) -> str:
    """A phase's name from the status line that starts it."""
    for prefix, label in (("loading", "load"), ("tracing", "trace"), ("assembling", "assemble"),
                          ("writing the weights", "write weights"), ("stamping", "stamp and convert"),
                          ("parity", "check (PyTorch references, ONNX Runtime)"), ("checking and writing", "publish")):
        if status.startswith(prefix):
            return label
    return status


if __name__ == "__main__":
    main()
