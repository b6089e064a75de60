"""Kimi Linear / K3-architecture decode on CPU: tokens/s and prefill time of ONNX Runtime on our with-past ONNX
against transformers' eager ``KimiLinearForCausalLM.generate`` (greedy, with its cache), on the tiny folder of
``attnres example --arch kimi-linear`` and on a ~0.5B-parameter K3-architecture folder (the Kimi Linear body with
Kimi K3's Attention Residuals keys), all in one interleaved run, each runner in a worker process of its own
(``family_decode.measure``); plus the export time and peak memory of each folder's export.

Each folder is exported for the ``portable`` target (the ``onnxruntime`` column) and for the ``onnxruntime`` target
(``ort-fused``: ONNX Runtime's own fused ops, docs/onnxruntime-target.md), ``attnres-export FOLDER --with-past
--target T`` (its parity check on, as users run it), each in a child process
whose peak resident set (``VmHWM``) is read as ``benchmarks/export_memory.py`` reads it. transformers
has no AttnRes model: for a folder with the AttnRes keys it runs the same folder's body without them (its loader
drops the unknown AttnRes weights), so that ratio compares our AttnRes decoder with transformers' standard-residual
body. Run from the repository root:
    python benchmarks/kimi_decode.py [--large-hidden 1024 --large-layers 8 --large-experts 64] [--no-large]
        [--batches 1,8] [--prompt 32] [--new 16] [--repeats 2] [--threads 1] [--json OUT.json]
    python benchmarks/kimi_decode.py --export-only --no-check     # the exports' own time and peak memory
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime
import torch
import transformers
from export_memory import run_child
from family_decode import (
    BACKENDS,
    Variant,
    add_attnres,
    load_average,
    measure,
    print_tables,
    summarize,
    write_hf_folder,
)

ATTNRES_BLOCK_LAYERS = 3
"""K3's ``attn_res_block_size`` of the large folder (layers per block; 8 layers give a partial last block)."""


def large_config(hidden: int, layers: int, experts: int, vocab: int) -> dict:
    """A Kimi Linear config of K3's layout (every fourth layer latent attention, the rest KDA; first feed-forward
    dense, the rest MoE with sigmoid grouped routing and a shared expert) at ``hidden``: KDA and latent heads of 128
    as Kimi-Linear-48B has, experts of width hidden/4, top-8."""
    from attnres_export.models.kimi.example import example_config

    heads = hidden // 128
    config = example_config(layers) | {
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": hidden * 11 // 4,
        "moe_intermediate_size": hidden // 4, "num_attention_heads": heads, "num_key_value_heads": heads,
        "kv_lora_rank": hidden // 2, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "num_local_experts": experts, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
        "max_position_embeddings": 4096}
    config["linear_attn_config"] = config["linear_attn_config"] | {"num_heads": heads, "head_dim": 128}
    return config


def export_child(folder: Path, out: Path, prompt: int, total: int, max_batch: int, check: bool,
                 target: str = "portable") -> dict:
    """``attnres-export`` in a child process: its peak RSS, wall and CPU seconds and parity lines."""
    summary = run_child("export", str(folder), "--with-past", "--target", target, "-o", str(out),
                        "--batch", f"1:1:{max_batch}", "--seq", f"1:1:{prompt}", "--past", f"0:{prompt}:{total}",
                        "--check" if check else "--no-check")
    if summary["parity_failed"]:
        sys.exit(f"attnres-export {folder.name}: its parity check failed (the tables report passed checks only):\n"
                 f"{summary['stdout'][-3000:]}")
    return {"peak_rss_gib": summary["maxrss_kib"] / 2**20, "wall_s": summary["wall"], "cpu_s": summary["cpu"],
            "onnx_gib": sum(p.stat().st_size for p in out.parent.glob(out.name + "*")) / 2**30}


def prepare(name: str, folder: Path, plain: Path, parameters: int, work: Path, args) -> tuple[Variant, dict]:
    onnx_path = work / f"{name}.with-past.onnx"
    export = export_child(folder, onnx_path, args.prompt, args.prompt + args.new, max(args.batches), args.check)
    print(f"# {name}: {parameters:,} parameters; export {export['wall_s']:.1f} s wall, {export['cpu_s']:.1f} s CPU, "
          f"peak RSS {export['peak_rss_gib']:.2f} GiB (weights {parameters * 4 / 2**30:.2f} GiB float32), ONNX "
          f"{export['onnx_gib']:.2f} GiB; load average "
          f"{load_average()}", flush=True)
    if args.export_only:
        return Variant(name, "kimi_linear", folder != plain, parameters, export["wall_s"], {}), export
    fused_path = work / f"{name}.with-past.ort.onnx"
    export_child(folder, fused_path, args.prompt, args.prompt + args.new, max(args.batches), args.check, "onnxruntime")
    runners = {"onnxruntime": ("onnxruntime", onnx_path, args.threads),
               "ort-fused": ("ort-fused", fused_path, args.threads),
               "transformers": ("transformers", plain, args.threads)}
    return Variant(name, "kimi_linear", folder != plain, parameters, export["wall_s"], runners), export


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large-hidden", type=int, default=1024)
    parser.add_argument("--large-layers", type=int, default=8)
    parser.add_argument("--large-experts", type=int, default=64)
    parser.add_argument("--large-vocab", type=int, default=32000)
    parser.add_argument("--no-large", action="store_true", help="only the tiny folders")
    parser.add_argument("--export-only", action="store_true", help="measure the exports, decode nothing")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="the exports' parity check (--no-check: the export's own peak)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of torch and ONNX Runtime alike")
    parser.add_argument("--workdir", type=Path, default=None, help="where the folders and ONNX go [a temp dir]")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load average {load_average()}; torch {torch.__version__} "
          f"({args.threads} threads), onnxruntime {onnxruntime.__version__} ({args.threads} intra-op threads), "
          f"transformers {transformers.__version__}")
    print(f"# prompt {args.prompt} tokens, {args.new} new tokens ({args.new - 1} decode steps), {args.repeats} "
          "interleaved rounds, medians; backends: " + ", ".join(b for b in BACKENDS if b != "ours-eager"), flush=True)
    from attnres_export.models.kimi.example import write_example_folder

    variants, exports = [], {}
    with tempfile.TemporaryDirectory(prefix="attnres-kimi-", dir=args.workdir) as tmp:
        work = Path(tmp)
        tiny, _, params = write_example_folder("kimi_linear", work / "tiny", seed=0)
        tiny_k3, _, _ = write_example_folder("kimi_linear", work / "tiny+attnres", seed=0, attn_res_block_size=2)
        for name, folder in (("tiny", tiny), ("tiny+attnres", tiny_k3)):
            variant, exports[name] = prepare(name, folder, tiny, params, work, args)
            variants.append(variant)
        if not args.no_large:
            config = large_config(args.large_hidden, args.large_layers, args.large_experts, args.large_vocab)
            print(f"# large folder config: {json.dumps(config)}", flush=True)
            started = time.perf_counter()
            plain = work / "large"
            params = write_hf_folder("kimi_linear", config, plain, seed=0)
            k3 = work / "large+attnres"
            add_attnres(plain, k3, ATTNRES_BLOCK_LAYERS, seed=1)
            print(f"# large folders written in {time.perf_counter() - started:.0f} s", flush=True)
            variant, exports["large+attnres"] = prepare("large+attnres", k3, plain, params, work, args)
            variants.append(variant)
        if not args.export_only:
            measure(variants, {b: _prompt(b, args.prompt) for b in args.batches}, args, skip={"ours-eager"})
            rows = [r for v in variants for r in summarize(v, args)]
    checked = "parity check on and passed" if args.check else "no parity check"
    if not args.export_only:
        print(f"\n## Kimi Linear, ONNX Runtime vs transformers; load average {load_average()}")
        print_tables(rows, args, export=f"portable, with past, {checked}")
    print(f"\nexports (attnres-export --with-past --target portable, {checked}); load average {load_average()}")
    print("| folder | wall s | CPU s | peak RSS GiB | ONNX GiB |")
    print("|---|---:|---:|---:|---:|")
    for name, e in exports.items():
        print(f"| {name} | {e['wall_s']:.1f} | {e['cpu_s']:.1f} | {e['peak_rss_gib']:.2f} | {e['onnx_gib']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": [] if args.export_only else rows, "exports": exports}, indent=2))


def _prompt(batch: int, length: int):
    import numpy as np

    return np.random.default_rng([batch, length]).integers(3, 256, size=(batch, length), dtype=np.int64)


if __name__ == "__main__":
    main()
