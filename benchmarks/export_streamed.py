"""Export memory that does not grow with the model: one Llama layer shape at two depths, in one run.

Writes a synthetic bfloat16 Hugging Face Llama folder (``config.json`` from transformers' ``LlamaConfig``, one
safetensors shard per layer with its index: the names and layout of published Llama checkpoints) at ``--small``
layers and at ``--large`` layers of the same width, runs ``attnres-export`` on each in a child process and reads the
child's peak resident set (``VmHWM``: every page it held at once, file-backed ones included) and wall time. At the
default Llama-2-13B width (hidden 5120, 40 heads, MLP 13824, vocabulary 32000) 40 layers are 13.0B parameters,
24.2 GiB of bfloat16: more than this 23 GiB machine holds. Every layer holds the same random values (written once,
so that writing 26 GB costs disk time only); the export reads each tensor as if it were new.

Goals (issue 33): peak RSS at most 1.5 GiB plus 3x the largest layer's bytes at both depths, and export time per
weight byte within 1.3x between them. The folder and the export need about 2.1x the large model's bytes of free
disk; the script checks that first and removes everything it wrote.
Run from the repository root:
    python benchmarks/export_streamed.py                            # 3 and 40 layers of Llama-2-13B's width
    python benchmarks/export_streamed.py --small 2 --large 4 --hidden 1024 --mlp 2816 --heads 8   # a quick run
    python benchmarks/export_streamed.py --check-small              # and the small model with its parity check
    python benchmarks/export_streamed.py --check-large              # and the large model with its parity check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from export_memory import run_child
from rich.console import Console
from rich.table import Table

GIB = 2**30


def layer_tensors(args: argparse.Namespace, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One decoder layer's tensors (Llama names under ``model.layers.{i}.``), random bfloat16."""
    head = args.hidden // args.heads

    def weight(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator) * cols ** -0.5).to(torch.bfloat16)

    return {"self_attn.q_proj.weight": weight(args.heads * head, args.hidden),
            "self_attn.k_proj.weight": weight(args.kv_heads * head, args.hidden),
            "self_attn.v_proj.weight": weight(args.kv_heads * head, args.hidden),
            "self_attn.o_proj.weight": weight(args.hidden, args.heads * head),
            "mlp.gate_proj.weight": weight(args.mlp, args.hidden),
            "mlp.up_proj.weight": weight(args.mlp, args.hidden),
            "mlp.down_proj.weight": weight(args.hidden, args.mlp),
            "input_layernorm.weight": torch.ones(args.hidden, dtype=torch.bfloat16),
            "post_attention_layernorm.weight": torch.ones(args.hidden, dtype=torch.bfloat16)}


def write_folder(args: argparse.Namespace, layers: int, folder: Path) -> tuple[int, int, int]:
    """A Llama folder of ``layers`` layers; returns (parameters, weight bytes, largest layer's bytes)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    generator = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp,
                         num_hidden_layers=layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=4096, tie_word_embeddings=False, dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(config.to_json_string())
    layer = layer_tensors(args, generator)
    edges = {"model.embed_tokens.weight": (torch.randn(args.vocab, args.hidden, generator=generator)
                                           * 0.02).to(torch.bfloat16),
             "model.norm.weight": torch.ones(args.hidden, dtype=torch.bfloat16),
             "lm_head.weight": (torch.randn(args.vocab, args.hidden, generator=generator)
                                * args.hidden ** -0.5).to(torch.bfloat16)}
    shards = layers + 1
    weight_map, total = {}, 0
    for index in range(shards):
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        tensors = edges if index == layers else {f"model.layers.{index}.{k}": v for k, v in layer.items()}
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    layer_bytes = sum(t.numel() * t.element_size() for t in layer.values())
    return total // 2, total, max(layer_bytes, max(t.numel() * t.element_size() for t in edges.values()))


def measure(args: argparse.Namespace, layers: int, work: Path, extra: list[str], console: Console) -> dict:
    folder, out = work / f"llama-{layers}", work / f"llama-{layers}.onnx"
    with console.status(f"writing a {layers}-layer bfloat16 Llama folder"):
        started = time.perf_counter()
        params, weight_bytes, largest = write_folder(args, layers, folder)
        written = time.perf_counter() - started
    console.print(f"{layers} layers: {params / 1e9:.2f}B parameters, {weight_bytes / GIB:.2f} GiB, written in "
                  f"{written:.0f} s")
    console.print(f"$ attnres-export {folder} -o {out} --dtype bfloat16 {' '.join(extra)}".rstrip())
    try:
        with console.status(f"attnres-export {folder.name} {' '.join(extra)}"):
            result = run_child("export", str(folder), "-o", str(out), "--dtype", "bfloat16", *extra)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for file in work.glob(f"{out.name}*"):
            file.unlink()
        for file in work.glob(f"{out.stem}.failed.onnx*"):
            file.unlink()
    return {"layers": layers, "params": params, "bytes": weight_bytes, "largest": largest, **result,
            "check": "--no-check" not in extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=3, help="layers of the small model")
    parser.add_argument("--large", type=int, default=40, help="layers of the large model")
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--heads", type=int, default=40)
    parser.add_argument("--kv-heads", type=int, default=0, help="[--heads]")
    parser.add_argument("--mlp", type=int, default=13824)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--check-small", action="store_true", help="also export the small model with its check")
    parser.add_argument("--check-large", action="store_true", help="also export the large model with its check")
    parser.add_argument("--workdir", type=Path, default=None, help="where the folders and exports go [a temp dir]")
    args = parser.parse_args()
    args.kv_heads = args.kv_heads or args.heads
    console = Console(width=160)
    head = args.hidden // args.heads
    per_layer = 2 * (2 * args.hidden * args.heads * head + 2 * args.hidden * args.kv_heads * head
                     + 3 * args.hidden * args.mlp + 2 * args.hidden)
    large_bytes = args.large * per_layer + 2 * 2 * args.vocab * args.hidden
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        free = shutil.disk_usage(tmp).free
        if free < 2.2 * large_bytes:
            sys.exit(f"{tmp}: {free / GIB:.1f} GiB free; the {args.large}-layer folder and its export need about "
                     f"{2.2 * large_bytes / GIB:.1f} GiB (pass --workdir on a larger disk, or lower --large)")
        runs = [measure(args, args.small, Path(tmp), ["--no-check"], console)]
        if args.check_small:
            runs.append(measure(args, args.small, Path(tmp), [], console))
        runs.append(measure(args, args.large, Path(tmp), ["--no-check"], console))
        if args.check_large:
            runs.append(measure(args, args.large, Path(tmp), [], console))
    table = Table(title=f"attnres-export of bfloat16 Llama folders, hidden {args.hidden}, MLP {args.mlp}, "
                        f"{args.heads}/{args.kv_heads} heads, vocabulary {args.vocab} ({os.cpu_count()} cores, "
                        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GIB:.0f} GiB)")
    for column in ("layers", "parameters", "weights", "check", "peak RSS", "goal: 1.5 GiB + 3x largest", "met",
                   "wall", "s per GiB"):
        table.add_column(column, justify="right")
    for run in runs:
        goal = 1.5 * GIB + 3 * run["largest"]
        peak = run["maxrss_kib"] * 1024
        met = "(export only)" if run["check"] else "yes" if peak <= goal else "no"
        table.add_row(str(run["layers"]), f"{run['params'] / 1e9:.2f}B", f"{run['bytes'] / GIB:.2f} GiB",
                      "on" if run["check"] else "off", f"{peak / GIB:.2f} GiB", f"{goal / GIB:.2f} GiB", met,
                      f"{run['wall']:.1f} s",
                      f"{run['wall'] / (run['bytes'] / GIB):.2f}")
    console.print(table)
    unchecked = [run for run in runs if not run["check"]]
    small, large = unchecked[0], unchecked[-1]
    ratio = (large["wall"] / large["bytes"]) / (small["wall"] / small["bytes"])
    console.print(f"time per weight byte, {large['layers']} over {small['layers']} layers: {ratio:.2f}x "
                  f"(goal at most 1.3x: {'met' if ratio <= 1.3 else 'not met'}); peak RSS {large['layers']} over "
                  f"{small['layers']} layers: {large['maxrss_kib'] / small['maxrss_kib']:.2f}x")
    for run in runs:
        if run["check"]:
            lines = run["stdout"].splitlines()
            start = next((i for i, line in enumerate(lines) if line.startswith("Parity against")), len(lines))
            console.print("\n".join(lines[start:]))


if __name__ == "__main__":
    main()
