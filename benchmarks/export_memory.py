"""Peak memory and time of ``attnres-export`` on a model of the size people deploy, against its weight bytes.

Writes a random checkpoint (stored in the export dtype, as released half-precision models are, or in the type
``--stored`` names), then runs ``attnres-export`` on it in a child process and reads the child's peak resident
set (``VmHWM``: every page it held at once, anonymous or file-backed; ``ru_maxrss`` would carry the parent's
peak over ``fork``) and its wall and CPU time. The ratio is peak RSS over the weight bytes of the exported
dtype; the interpreter's own footprint (Python, torch, onnx, ONNX Runtime imported) is measured in a separate
child and reported beside it.
Run from the repository root:
    python benchmarks/export_memory.py                              # 1.44B parameters, float16
    python benchmarks/export_memory.py --layers 4 --d-model 512     # a quick run
    python benchmarks/export_memory.py --stored float32             # a float32 checkpoint exported to float16
    python benchmarks/export_memory.py --folder                     # a config.json + safetensors folder
    python benchmarks/export_memory.py --family qwen3_moe --dtype bfloat16 --layers 18 --d-model 1024 \
        --experts 32 --moe-d-ff 512 --top-k 4                       # a 1.0B Hugging Face MoE folder, bf16
With ``--family qwen3_moe|deepseek_v3`` the checkpoint is a Hugging Face folder written by transformers'
``save_pretrained`` at random init in the stored dtype (sharded at ``--shard`` with its index), read by the
decoder family's folder reader; ``--d-ff`` is then the dense feed-forward width (DeepSeek-V3's first layer).
Pass ``-- --no-check`` style extra arguments after ``--`` to hand them to ``attnres-export``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from attnres_export.dtypes import torch_dtype
from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from attnres_export.models.hf_folder import save_folder

HF_FAMILIES = ("qwen3_moe", "deepseek_v3")

CHILD = """
import json, sys, time
wall, cpu = time.perf_counter(), time.process_time()
if sys.argv[1] == "export":
    from attnres_export.cli import export_main as main
    sys.argv = ["attnres-export", *sys.argv[2:]]
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
else:
    import onnx, onnxruntime, torch, attnres_export.cli  # noqa: F401
    code = 0
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"code": code, "maxrss_kib": int(status["VmHWM"].split()[0]),
                  "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}), file=sys.stderr)
"""


PARITY_FAILED = "parity check failed"
"""What ``attnres-export`` prints when the export ran to the end but an output missed its bar: still measured."""


def run_child(*args: str) -> dict:
    """Run CHILD with ``args``; its last stderr line is its JSON summary. ``parity_failed``: the export ran to
    the end and kept its file, but its parity check failed (the memory and time figures still count)."""
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True,
                          text=True, check=False)
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    parity_failed = PARITY_FAILED in done.stderr
    if summary["code"] not in (0, None) and not parity_failed:
        sys.exit(f"attnres-export failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return {**summary, "stdout": done.stdout, "parity_failed": parity_failed}


def write_checkpoint(cfg: AttnResLMConfig, dtype: str, path: Path, folder: bool = False) -> int:
    """A random checkpoint of ``cfg`` with weights stored in ``dtype`` (a ``.pt``, or a safetensors folder);
    returns the parameter count."""
    model = make_example(cfg).to(torch_dtype(dtype))
    if folder:
        save_folder(model.state_dict(), cfg, path)
    else:
        save_checkpoint(model, cfg, path)
    return sum(p.numel() for p in model.parameters())


def write_hf_moe_folder(args: argparse.Namespace, dtype: str, path: Path) -> int:
    """A random Hugging Face ``args.family`` folder (transformers' own classes and weight names) stored in
    ``dtype``; returns the parameter count."""
    from family_decode import write_hf_folder

    from attnres_export.models.decoder.example import example_config

    heads = args.d_model // 64
    config = example_config(args.family, None, args.layers) | {
        "vocab_size": args.vocab, "hidden_size": args.d_model, "intermediate_size": args.d_ff,
        "num_attention_heads": heads, "num_key_value_heads": args.kv_heads or heads, "head_dim": 64,
        "moe_intermediate_size": args.moe_d_ff, "num_experts_per_tok": args.top_k, "max_position_embeddings": 4096}
    if args.family == "qwen3_moe":
        config["num_experts"] = args.experts
    else:
        config |= {"n_routed_experts": args.experts, "num_key_value_heads": heads, "q_lora_rank": args.d_model // 2,
                   "kv_lora_rank": args.d_model // 4, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                   "v_head_dim": 64, "head_dim": 32}
    return write_hf_folder(args.family, config, path, seed=0, dtype=torch_dtype(dtype), max_shard_size=args.shard)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--d-ff", type=int, default=6144)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--block-size", type=int, default=4, help="sublayers per block, 0 for Full AttnRes")
    parser.add_argument("--dtype", default="float16", help="type of the export (and of the checkpoint)")
    parser.add_argument("--stored", default=None, help="store the checkpoint in this type instead [--dtype]")
    parser.add_argument("--folder", action="store_true", help="write a config.json + safetensors folder, not a .pt")
    parser.add_argument("--family", choices=("attnres-lm", *HF_FAMILIES), default="attnres-lm",
                        help="attnres-lm (our checkpoint) or a Hugging Face MoE folder of this family")
    parser.add_argument("--kv-heads", type=int, default=0, help="--family: K/V heads [--d-model / 64]")
    parser.add_argument("--experts", type=int, default=32, help="--family: routed experts")
    parser.add_argument("--moe-d-ff", type=int, default=512, help="--family: width of each expert")
    parser.add_argument("--top-k", type=int, default=4, help="--family: experts per token")
    parser.add_argument("--shard", default="1GB", help="--family: save_pretrained's max_shard_size")
    parser.add_argument("--workdir", type=Path, default=None, help="where the checkpoint and ONNX go [a temp dir]")
    parser.add_argument("extra", nargs="*", help="more attnres-export arguments (after --)")
    args = parser.parse_args()
    cfg = AttnResLMConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                      d_ff=args.d_ff, block_size=args.block_size, max_seq_len=512)
    console = Console()
    hf = args.family != "attnres-lm"
    args.folder = args.folder or hf
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        ckpt = Path(tmp) / ("model" if args.folder else "model.pt")
        stored = args.stored or args.dtype
        with console.status(f"writing a random {stored} checkpoint"):
            started = time.perf_counter()
            params = write_hf_moe_folder(args, stored, ckpt) if hf else write_checkpoint(cfg, stored, ckpt,
                                                                                        args.folder)
            gc.collect()
        size = sum(f.stat().st_size for f in ([*ckpt.iterdir()] if args.folder else [ckpt]))
        console.print(f"checkpoint: {params / 1e9:.2f}B parameters, {size / 2**30:.2f} GiB "
                      f"({'folder' if args.folder else '.pt'}; {time.perf_counter() - started:.0f} s to write)")
        with console.status("measuring the interpreter's own footprint"):
            baseline = run_child("imports")
        with console.status("running attnres-export"):
            export = run_child("export", str(ckpt), "--dtype", args.dtype, "-o", str(Path(tmp) / "model.onnx"),
                               *args.extra)
        written = sum(p.stat().st_size for p in Path(tmp).glob("model*.onnx*"))  # model.failed.onnx too
    weight_bytes = params * torch.empty((), dtype=torch_dtype(args.dtype)).element_size()
    body = f"{args.family} {args.experts} experts top-{args.top_k} " if hf else ""
    table = Table(title=f"attnres-export, {body}{args.layers} layers d{args.d_model} {args.dtype} from {stored} "
                        f"{'folder' if args.folder else '.pt'} "
                        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    for column in ("what", "figure", "x weight bytes"):
        table.add_column(column, justify="right" if column != "what" else "left")
    gib = 2**30
    table.add_row("weights (exported dtype)", f"{weight_bytes / gib:.2f} GiB", "1.00")
    table.add_row("ONNX written (with external data)", f"{written / gib:.2f} GiB", f"{written / weight_bytes:.2f}")
    table.add_row("peak RSS, attnres-export", f"{export['maxrss_kib'] / 2**20:.2f} GiB",
                  f"{export['maxrss_kib'] * 1024 / weight_bytes:.2f}")
    table.add_row("peak RSS, imports alone", f"{baseline['maxrss_kib'] / 2**20:.2f} GiB",
                  f"{baseline['maxrss_kib'] * 1024 / weight_bytes:.2f}")
    checked = "--no-check" not in args.extra
    table.add_row("parity check", ("failed" if export["parity_failed"] else "passed") if checked else "off", "")
    table.add_row("export wall time", f"{export['wall']:.1f} s", "")
    table.add_row("export CPU time", f"{export['cpu']:.1f} s", "")
    table.add_row("goal: peak RSS at most 3x the weight bytes", "met" if export["maxrss_kib"] * 1024 <= 3 * weight_bytes
                  else "not met", f"{export['maxrss_kib'] * 1024 / weight_bytes:.2f}")
    table.add_row("load average (1, 5, 15 min) after", " ".join(f"{x:.2f}" for x in os.getloadavg()), "")
    console.print(table)
    if checked:
        print(parity_table(export["stdout"]))


def parity_table(stdout: str) -> str:
    """The parity table ``attnres-export`` printed (from its title line on)."""
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Parity against")), len(lines))
    return "\n".join(lines[start:])


if __name__ == "__main__":
    main()
