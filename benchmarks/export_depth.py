"""Export time against depth, in one run: ``attnres-export`` assembling the graph from the model's plan (each kind of
layer traced once, the default), the same export tracing the whole model (``--trace-whole``), and
``torch.onnx.export(..., dynamo=True)`` of transformers' ``LlamaForCausalLM`` of the same size, side by side (timed
as a user runs it: ``from_pretrained`` of a saved folder, the export, ``save``; ours from the checkpoint file too).

Models: d_model 512, 8 heads, d_ff 1408, vocab 8192, max_seq_len 512; 12 layers with Block AttnRes (S = 4) and 48
layers with Full AttnRes (the configurations of docs/benchmarks.md's earlier export figures), dynamic batch 1..8 and
sequence 1..512. Every export runs in a child process of its own (2 torch threads), timed after a warm-up export of a
one-layer model of the same kind in that child, so that a figure is the exporter's and not the imports' or torch's
first-call setup; the child's first (cold) export of the warm-up model is shown too. ``attnres-export`` runs without
its parity check for the goals (the check is the same for both paths; the phase table shows it). Each export writes to a
path that does not exist yet (an earlier round's files are deleted first, outside the timing). Wall and CPU time
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

def llama(folder, out):
    # What a user of transformers runs: load the checkpoint folder, export, save.
    import contextlib, io, logging, warnings
    from transformers import LlamaForCausalLM
    ids = torch.zeros(2, 64, dtype=torch.int64)
    dims = {0: torch.export.Dim("batch", min=1, max=8),
            1: torch.export.Dim("seq", min=1, max=args["sizes"]["max_seq_len"])}
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    start = (time.perf_counter(), time.process_time())
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        model = LlamaForCausalLM.from_pretrained(folder).eval()
        program = torch.onnx.export(model, (ids,), dynamo=True, dynamic_shapes=(dims,), input_names=["input_ids"],
                                    output_names=["logits"])
        program.save(out)
    return time.perf_counter() - start[0], time.process_time() - start[1], []

def run(spec, out):
    if spec["kind"] == "llama":
        return llama(spec["checkpoint"], out)
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
    """Random attnres checkpoints (12, 48 and, for the warm-up, 1 layer) and LlamaForCausalLM folders (12, 1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    paths = {}
    for layers, block in [*DEPTHS.items(), (1, 0)]:
        cfg = AttnResLMConfig(**SIZES, n_layers=layers, block_size=block)
        paths[f"attnres-{layers}"] = folder / f"attnres-{layers}.pt"
        save_checkpoint(make_example(cfg, seed=layers), cfg, paths[f"attnres-{layers}"])
    for layers in (12, 1):
        cfg = LlamaConfig(vocab_size=SIZES["vocab_size"], hidden_size=SIZES["d_model"], intermediate_size=SIZES["d_ff"],
                          num_hidden_layers=layers, num_attention_heads=SIZES["n_heads"],
                          num_key_value_heads=SIZES["n_heads"], max_position_embeddings=SIZES["max_seq_len"],
                          use_cache=False)
        torch.manual_seed(layers)
        paths[f"llama-{layers}"] = folder / f"llama-{layers}"
        LlamaForCausalLM(cfg).save_pretrained(paths[f"llama-{layers}"])
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
            "llama 12": ({"kind": "llama", "checkpoint": str(ckpt["llama-12"])},
                         {"kind": "llama", "checkpoint": str(ckpt["llama-1"])}),
            "assembled 12 + check": attnres(12, False, check=True), "whole 12 + check": attnres(12, True, check=True),
        }
        if args.skip_whole_48:
            del runs["whole 48"]
        results: dict[str, list[dict]] = {name: [] for name in runs}
        for round_ in range(args.rounds):
            for name, (measured, warmup) in runs.items():
                with console.status(f"round {round_ + 1}/{args.rounds}: {name}"):
                    _remove_outputs(folder, name)
                    results[name].append(child(measured, warmup, folder / f"{_file(name)}.onnx", args.threads))
        sizes = {name: sum(p.stat().st_size for p in folder.glob(f"{_file(name)}.onnx*") if ".warmup." not in p.name)
                 for name in runs}
    report(console, results, sizes, args)


def _remove_outputs(folder: Path, run: str) -> None:
    """Delete an earlier round's files of ``run``, so every export writes to a new path as a first export does:
    replacing an existing 652 MB file costs ext4 0.3 to 0.4 s in the rename (docs/exporter-notes.md#weights-io)."""
    for path in folder.glob(f"{_file(run)}.onnx*"):
        path.unlink()


def _file(run: str) -> str:
    return run.replace(" + ", "-").replace(" ", "-")


def report(console: Console, results: dict[str, list[dict]], sizes: dict[str, int], args) -> None:
    med = {name: (statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs),
                  statistics.median(r["cold_warmup"] for r in rs)) for name, rs in results.items()}
    table = Table(title=f"export time, d512 ({platform.processor() or platform.machine()}, {args.threads} threads, "
                        f"torch {torch.__version__}, median of {args.rounds} round(s))")
    for column in ("export", "model", "wall s", "CPU s", "cold warm-up wall s", "ONNX MB"):
        table.add_column(column, justify="left" if column in ("export", "model") else "right")
    models = {"12": "12 layers, Block S=4", "48": "48 layers, Full"}
    for name, (wall, cpu, cold) in med.items():
        if "check" in name:
            continue
        what = {"assembled": "attnres-export --no-check (assembled)",
                "whole": "attnres-export --no-check --trace-whole",
                "llama": "torch.onnx.export(dynamo=True), LlamaForCausalLM"}[name.split()[0]]
        model = models[name.split()[1]] if name.split()[0] != "llama" else "12 layers, same sizes"
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
    phased = {name: _phase_medians(rs) for name, rs in results.items() if name.split()[0] != "llama"}
    depth_free = {name: sum(by[label][0] for label in ("trace", "assemble", "stamp and convert") if label in by)
                  for name, by in phased.items()}
    ratios.add_row("assembled 48 / 12, without the weights' I/O (load, write, publish)",
                   f"{depth_free['assembled 48'] / depth_free['assembled 12']:.2f}x", "", "", "")
    console.print(ratios)
    phases = Table(title="phases (median wall s / CPU s); the check runs export again with the parity check")
    phases.add_column("phase")
    for name in phased:
        phases.add_column(name, justify="right")
    labels = list(dict.fromkeys(label for by in phased.values() for label in by))
    for label in labels:
        phases.add_row(label, *(f"{by[label][0]:.2f} / {by[label][1]:.2f}" if label in by else "" for by in
                                phased.values()))
    phases.add_row("total", *(f"{med[name][0]:.2f} / {med[name][1]:.2f}" for name in phased))
    console.print(phases)
    for name in ("assembled 12", "assembled 48"):
        by = phased[name]
        io = sum(by[label][0] for label in ("load", "write weights", "publish") if label in by)
        console.print(f"floor, {name}: reading ({_mb(sizes, name)} MB checkpoint), writing and publishing the weights: "
                      f"{io:.2f} s wall of {med[name][0]:.2f} s; writing alone {by['write weights'][0]:.2f} s "
                      f"({_mb(sizes, name) / by['write weights'][0]:.0f} MB/s)")


def _mb(sizes: dict[str, int], name: str) -> int:
    return round(sizes[name] / 1e6)


def _phase_medians(runs: list[dict]) -> dict[str, tuple[float, float]]:
    """Per phase, the median over runs of its summed (wall, CPU) seconds."""
    per_run = []
    for run in runs:
        sums: dict[str, tuple[float, float]] = {}
        for text, wall, cpu in run["phases"]:
            before = sums.get(_phase(text), (0.0, 0.0))
            sums[_phase(text)] = (before[0] + wall, before[1] + cpu)
        per_run.append(sums)
    labels = list(dict.fromkeys(label for sums in per_run for label in sums))
    return {label: (statistics.median(s.get(label, (0.0, 0.0))[0] for s in per_run),
                    statistics.median(s.get(label, (0.0, 0.0))[1] for s in per_run)) for label in labels}


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
