"""How long the commands take as a user sees them: whole processes, started and waited for (issue 36, item 3).

Each command runs as a child process of its own (``subprocess``, wall time from start to exit, the interpreter's
start and shutdown included), N times; the table shows the best and the median. Timed:

- ``attnres --help``, ``attnres-export --help``, ``attnres --version``, ``attnres-export --version``;
- refusals that need no model: a missing file, a folder without config.json, a bad option value (``--opset 3``);
- ``attnres-export MODEL --no-check`` of a 12-layer attnres-lm checkpoint (d_model 512, 8 heads, d_ff 1408, vocab
  8192, max_seq_len 512, Block AttnRes S = 4: the size of docs/benchmarks.md's export figures, written first with
  ``attnres example``), twice: cold (``ATTNRES_TRACE_CACHE`` an empty folder at every run: the pieces are traced) and
  warm (a folder the uncounted run filled: the trace is read from the cache, docs/exporter-notes.md#the-trace-cache),
  each against a whole process that loads transformers' ``LlamaForCausalLM`` of the same size
  (hidden 512, 12 layers, 8 heads and 8 KV heads, intermediate 1408, vocab 8192) from a saved folder and runs
  ``torch.onnx.export(dynamo=True)`` with the same dynamic batch 1..8 and sequence 1..512, then saves it;
- for scale: ``python -c pass``, ``python -c "import torch"`` and a whole process exporting one ``nn.Linear``
  through ``torch.onnx.export(dynamo=True)``: the fixed cost of the exporter both exports above go through (torch,
  torch.export, onnxscript's op registry), which no model-side work removes.

Every refusal's exit code and message are checked, so that a figure is the refusal's and not some other failure's;
every export writes to a path that does not exist yet (the previous run's files are deleted first, outside the
timing). The goals (issue 36): refusals and help under 1 s; the export at most 0.2x the Llama process. Ratios are
of medians measured in the same run.
Run from the repository root, idle:
    python benchmarks/command_latency.py                    # 7 runs of the fast commands, 3 of each export
    python benchmarks/command_latency.py --runs 11 --export-runs 5
    python benchmarks/command_latency.py --exports-only --export-runs 3   # the export rows and their floor only
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

SIZES = {"vocab": 8192, "d_model": 512, "heads": 8, "d_ff": 1408, "max_seq_len": 512, "layers": 12, "block": 4}
FAST_GOAL_S = 1.0
EXPORT_GOAL = 0.2
"""``attnres-export --no-check`` at most this fraction of the Llama process's time."""
CACHE = "ATTNRES_TRACE_CACHE"

LLAMA_WRITE = r"""
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
s = {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}
cfg = LlamaConfig(vocab_size=s["vocab"], hidden_size=s["d_model"], intermediate_size=s["d_ff"],
                  num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
                  max_position_embeddings=s["max_seq_len"], use_cache=False)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])
"""

LLAMA_EXPORT = r"""
# What a user of transformers runs: load the checkpoint folder, export, save.
import sys, torch
from transformers import LlamaForCausalLM
folder, out, max_seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = LlamaForCausalLM.from_pretrained(folder).eval()
ids = torch.zeros(2, 64, dtype=torch.int64)
dims = {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=1, max=max_seq)}
program = torch.onnx.export(model, (ids,), dynamo=True, dynamic_shapes=(dims,), input_names=["input_ids"],
                            output_names=["logits"], verbose=False)
program.save(out)
"""

TINY_EXPORT = r"""
# The fixed cost of the exporter both exports go through: torch.onnx.export(dynamo=True) of one Linear, without
# onnxscript's optimizer (attnres-export runs its own, exporter/optimize.py).
import sys, torch
program = torch.onnx.export(torch.nn.Linear(8, 8), (torch.zeros(2, 8),), dynamo=True, optimize=False, verbose=False)
program.save(sys.argv[1])
"""


@dataclass
class Case:
    name: str
    argv: list[str]
    rc: int = 0
    expect: str = ""
    """Text the output must hold (a refusal's message), so that the figure is that refusal's."""
    goal: str = ""
    """``fast`` (under FAST_GOAL_S), ``export``, ``baseline`` or empty (shown for scale)."""
    outputs: list[Path] = field(default_factory=list)
    """Files (with their external-data siblings) deleted before each run."""
    times: list[float] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for the command."""
    emptied: Path | None = None
    """A folder emptied before each run (the cold export's trace cache)."""
    read_only: Path | None = None
    """A folder that a run may fill but not change once filled (the warm export's trace cache: a hit writes
    nothing there), so that a warm figure is never a trace's."""


def timed(case: Case, cwd: Path) -> float:
    for out in case.outputs:
        for path in out.parent.glob(f"{out.name}*"):
            path.unlink()
    if case.emptied is not None:
        shutil.rmtree(case.emptied, ignore_errors=True)
        case.emptied.mkdir()
    before = listing(case.read_only)
    start = time.perf_counter()
    done = subprocess.run(case.argv, cwd=cwd, capture_output=True, text=True, check=False,
                          env={**os.environ, **case.env})
    wall = time.perf_counter() - start
    text = done.stdout + done.stderr
    if done.returncode != case.rc or case.expect not in text:
        sys.exit(f"{case.name}: exit {done.returncode} (expected {case.rc}), output:\n{text[-3000:]}")
    if before and listing(case.read_only) != before:
        sys.exit(f"{case.name}: {case.read_only} changed: the export traced instead of reading its trace")
    return wall


def listing(folder: Path | None) -> dict[str, int]:
    """Each file of ``folder`` and its inode; empty when there is none. A trace is stored by renaming a new file into
    place (a new inode), while a hit only touches its entry's modification time (the cache's least-recently-used
    mark), so the inodes tell a read from a trace."""
    if folder is None or not folder.is_dir():
        return {}
    return {path.name: path.stat().st_ino for path in folder.iterdir()}


def tool(name: str) -> str:
    """A console script of the running interpreter's environment."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else shutil.which(name) or sys.exit(f"{name} is not installed")


def cases(work: Path) -> list[Case]:
    py, attnres, export = sys.executable, tool("attnres"), tool("attnres-export")
    (work / "no-config").mkdir()
    model, llama = work / "attnres-12.pt", work / "llama-12"
    return [
        Case("python -c pass", [py, "-c", "pass"]),
        Case('python -c "import torch"', [py, "-c", "import torch"]),
        Case("torch.onnx.export(dynamo=True) of nn.Linear(8, 8) (the floor)",
             [py, "-c", TINY_EXPORT, str(work / "linear.onnx")], outputs=[work / "linear.onnx"]),
        Case("attnres --help", [attnres, "--help"], expect="Usage: attnres", goal="fast"),
        Case("attnres-export --help", [export, "--help"], expect="Usage: attnres-export", goal="fast"),
        Case("attnres --version", [attnres, "--version"], expect="attnres-export ", goal="fast"),
        Case("attnres-export --version", [export, "--version"], expect="attnres-export ", goal="fast"),
        Case("attnres-export missing.pt (no such file)", [export, "missing.pt"], rc=1,
             expect="no such file or folder", goal="fast"),
        Case("attnres-export no-config/ (folder without config.json)", [export, "no-config"], rc=1,
             expect="needs config.json", goal="fast"),
        Case("attnres-export MODEL --opset 3 (bad option value)", [export, str(model), "--opset", "3"], rc=2,
             expect="--opset", goal="fast"),
        Case("attnres-export MODEL --no-check (12 layers, d512), cold trace cache",
             [export, str(model), "--no-check", "-o", str(work / "cold.onnx")], expect="wrote", goal="export",
             outputs=[work / "cold.onnx"], env={CACHE: str(work / "cold-traces")}, emptied=work / "cold-traces"),
        Case("attnres-export MODEL --no-check (12 layers, d512), warm trace cache",
             [export, str(model), "--no-check", "-o", str(work / "warm.onnx")], expect="wrote", goal="export",
             outputs=[work / "warm.onnx"], env={CACHE: str(work / "warm-traces")}, read_only=work / "warm-traces"),
        Case("torch.onnx.export(dynamo=True), LlamaForCausalLM, same size",
             [py, "-c", LLAMA_EXPORT, str(llama), str(work / "llama.onnx"), str(SIZES["max_seq_len"])],
             goal="baseline", outputs=[work / "llama.onnx"]),
    ]


def write_models(work: Path) -> None:
    """The 12-layer attnres-lm checkpoint (``attnres example``) and the Llama folder of the same size."""
    s = SIZES
    subprocess.run([tool("attnres"), "example", str(work / "attnres-12.pt"), "--layers", str(s["layers"]),
                    "--d-model", str(s["d_model"]), "--heads", str(s["heads"]), "--d-ff", str(s["d_ff"]),
                    "--vocab", str(s["vocab"]), "--max-seq-len", str(s["max_seq_len"]), "--block-size",
                    str(s["block"])], check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", LLAMA_WRITE, str(work / "llama-12"), *(f"{k}={v}" for k, v in s.items())],
                   check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs of each fast command (default 7)")
    parser.add_argument("--export-runs", type=int, default=3, help="runs of each export (default 3)")
    parser.add_argument("--exports-only", action="store_true",
                        help="time only the exports (ours cold and warm, Llama, the nn.Linear floor)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="command-latency-") as tmp:
        work = Path(tmp)
        print("writing the models ...", flush=True)
        write_models(work)
        todo = [case for case in cases(work) if case.outputs or not args.exports_only]
        for case in todo:  # one warm-up run each (page cache), not counted; checks the exit code and message too
            timed(case, work)
        rounds = args.export_runs if args.exports_only else max(args.runs, args.export_runs)
        for i in range(rounds):  # interleaved, so that a change of load touches every command alike
            for case in todo:
                if i < (args.export_runs if case.outputs else args.runs):
                    case.times.append(timed(case, work))
            print(f"round {i + 1}/{rounds} done", flush=True)
    report(todo, args, load_before)


def report(todo: list[Case], args, load_before: tuple[float, ...]) -> None:
    med = {c.name: statistics.median(c.times) for c in todo}
    baseline = next(c for c in todo if c.goal == "baseline")
    import torch  # for the heading only, after the timings

    print(f"\nwhole-process wall time, {date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, torch {torch.__version__}; load average before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = [("command", "exit", "runs", "best s", "median s", "goal", "met")]
    for c in todo:
        if c.goal == "fast":
            goal, met = f"< {FAST_GOAL_S:.0f} s", "yes" if med[c.name] < FAST_GOAL_S else "no"
        elif c.goal == "export":
            ratio = med[c.name] / med[baseline.name]
            goal, met = f"<= {EXPORT_GOAL}x Llama ({ratio:.2f}x)", "yes" if ratio <= EXPORT_GOAL else "no"
        else:
            goal = met = ""
        rows.append((c.name, str(c.rc), str(len(c.times)), f"{min(c.times):.2f}", f"{med[c.name]:.2f}", goal, met))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = zip(row, widths, strict=True)
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(cells)))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for ours in (c for c in todo if c.goal == "export"):
        ratio, best = med[ours.name] / med[baseline.name], min(ours.times) / min(baseline.times)
        print(f"attnres-export --no-check ({ours.name.rpartition(', ')[2]}) / Llama torch.onnx.export: {ratio:.3f}x "
              f"(medians; best {best:.3f}x)")


if __name__ == "__main__":
    main()
