"""Decode tokens/s and prefill time per decoder family, on the same weights: ONNX Runtime CPU on our with-past ONNX
of the ``portable`` target (``attnres-export FOLDER --with-past --target portable``, standard ops) and of the
``onnxruntime`` target (``ort-fused``: ONNX Runtime's own fused ops, docs/onnxruntime-target.md) vs our eager PyTorch
decoder (``attnres generate --backend
pytorch``'s path) vs transformers' eager ``generate`` (greedy, ``do_sample=False``, ``use_cache=True``), batch 1 and 8,
plus the export time of each folder.

Per family (``llama``, ``qwen2``, ``qwen3``, ``qwen3_moe``, ``deepseek_v3``, ``kimi_linear``) the script writes a
Hugging Face folder at random init with transformers' own ``save_pretrained`` (widths in ``SIZES``, the family's
features from ``attnres example``'s configs), and the same folder with Kimi K3's Attention Residuals keys added
(``+attnres``: ``attn_res_block_size`` and random, non-zero per-site weights). transformers has no AttnRes model: its
column for a ``+attnres`` row runs the plain folder (the same body weights without the AttnRes sites), so that ratio
compares our AttnRes decoder against transformers' standard-residual body, and the greedy tokens differ by design.
Every runner (backend and folder) runs in a worker process of its own (``rounds.Workers``: in one process the order
models are loaded in moves their speed), and in each round every runner runs in turn on the same prompt, in
``rounds.round_order``, so load from other processes hits them alike; figures are medians over the rounds. Run from
the repository root:
    python benchmarks/family_decode.py [--families llama,qwen3_moe] [--no-attnres] [--batches 1,8]
        [--prompt 32] [--new 32] [--repeats 3] [--threads 1] [--hidden 512] [--layers 4] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime
import torch
import transformers
from rounds import Workers, round_order

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_linear")
BACKENDS = ("onnxruntime", "ort-fused", "ours-eager", "transformers")
"""``onnxruntime``: the portable target's graph; ``ort-fused``: the onnxruntime target's."""
ATTNRES_BLOCK_LAYERS = 2
"""K3's ``attn_res_block_size`` (decoder layers per block) of the ``+attnres`` folders."""


def sizes(hidden: int, layers: int, vocab: int) -> dict[str, dict]:
    """Per family, the widths laid over ``attnres example``'s config (heads of 64, 2 query heads per K/V head,
    16 experts of width hidden/2 with top-2, latent ranks of hidden/4)."""
    heads = hidden // 64
    common = {"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": hidden * 11 // 4,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2),
              "head_dim": 64, "max_position_embeddings": 1024}
    experts = {"moe_intermediate_size": hidden // 2, "num_experts_per_tok": 2}
    latent = {"num_key_value_heads": heads, "kv_lora_rank": hidden // 4, "qk_nope_head_dim": 64,
              "qk_rope_head_dim": 32, "v_head_dim": 64}
    return {
        "llama": common, "qwen2": common, "qwen3": common,
        "qwen3_moe": common | experts | {"num_experts": 16},
        "deepseek_v3": common | experts | latent | {"q_lora_rank": hidden // 2, "n_routed_experts": 16,
                                                    "head_dim": 32},
        "kimi_linear": {k: v for k, v in common.items() if k != "head_dim"} | experts | latent
        | {"num_local_experts": 16},
    }


def hf_config(family: str, over: dict) -> dict:
    """``config.json`` keys of ``family`` (``attnres example``'s features) with ``over``'s widths."""
    if family == "kimi_linear":
        from attnres_export.models.kimi.example import example_config

        config = example_config(over["num_hidden_layers"]) | over
        heads = over["num_attention_heads"]
        config["linear_attn_config"] = config["linear_attn_config"] | {"num_heads": heads, "head_dim": 64}
        return config
    from attnres_export.models.decoder.example import example_config

    return example_config(family, None, over["num_hidden_layers"]) | over


def write_hf_folder(family: str, config: dict, out: Path, seed: int, dtype: torch.dtype = torch.float32,
                    max_shard_size: str = "50GB") -> int:
    """transformers' ``save_pretrained`` of ``family`` at random init, built in ``dtype`` (a bf16 1B model never
    exists in float32), router score biases random too so that routing is not decided by the weights alone;
    returns the parameter count."""
    torch.manual_seed(seed)
    keys = {k: v for k, v in config.items() if k != "model_type"}
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(family, **keys),
                                                          dtype=dtype).eval()
    with torch.no_grad():
        for name, tensor in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.02)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    return sum(p.numel() for p in model.parameters())


def add_attnres(source: Path, out: Path, block_layers: int, seed: int) -> None:
    """``source`` copied to ``out`` with K3's AttnRes keys: ``attn_res_block_size`` and, per site, a key-norm gain
    near 1 and a pseudo-query of std ``2/sqrt(D)`` (as ``attnres example``), in the stored dtype."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    shards = sorted(out.glob("*.safetensors"))
    with safe_open(str(shards[-1]), "pt") as f:
        dtype = f.get_tensor(next(iter(f.keys()))).dtype

    def pair(prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}_norm.weight": (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype),
                f"{prefix}_proj.weight": (2 / d**0.5 * torch.randn(1, d, generator=gen)).to(dtype)}

    sites = pair("model.output_attn_res")
    for i in range(layers):
        sites |= pair(f"model.layers.{i}.self_attention_res") | pair(f"model.layers.{i}.mlp_res")
    save_file(sites, str(out / "attn_res.safetensors"), metadata={"format": "pt"})
    index_path = out / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:
        first = shards[0].name
        with safe_open(str(shards[0]), "pt") as f:
            index = {"metadata": {}, "weight_map": dict.fromkeys(f.keys(), first)}
    index["weight_map"] |= dict.fromkeys(sites, "attn_res.safetensors")
    index_path.write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(config | {"attn_res_block_size": block_layers}, indent=2))


def export_with_past(folder: Path, out: Path, prompt: int, total: int, max_batch: int,
                     target: str = "portable") -> float:
    """Our with-past export of ``folder`` for ``target`` (no parity check: the greedy tokens are compared below);
    the seconds it took."""
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    start = time.perf_counter()
    export_checkpoint(ExportOptions(folder, output=out, target=target, with_past=True, check=False,
                                    batch=DimRange(1, 1, max_batch), seq=DimRange(1, 1, prompt),
                                    past=DimRange(0, prompt, total)))
    return time.perf_counter() - start


@dataclass
class Timing:
    prefill_s: float
    decode_s: float
    tokens: list[int]
    """The first row's new tokens."""


def run_decoder(decoder, prompt: np.ndarray, new: int) -> Timing:
    """One greedy generation through our ``Decoder`` (prefill at past 0, then ``new - 1`` single-token steps)."""
    b, n = prompt.shape
    start = time.perf_counter()
    logits, past = decoder.step(prompt, np.ones((b, n), np.int64), np.broadcast_to(np.arange(n), (b, n)).copy(),
                                decoder.empty_past(b))
    token = logits[:, -1].argmax(-1)
    prefill = time.perf_counter() - start
    tokens = [int(token[0])]
    start = time.perf_counter()
    for pos in range(n, n + new - 1):
        logits, past = decoder.step(token[:, None].astype(np.int64), np.ones((b, pos + 1), np.int64),
                                    np.full((b, 1), pos, np.int64), past)
        token = logits[:, -1].argmax(-1)
        tokens.append(int(token[0]))
    return Timing(prefill, time.perf_counter() - start, tokens)


class StepClock(transformers.LogitsProcessor):
    """Notes the time at each of ``generate``'s steps (called after every forward): the first is the end of the
    prefill, the rest the ends of the decode steps; works at any batch, unlike a streamer."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def run_transformers(model, prompt: np.ndarray, new: int) -> Timing:
    """transformers' eager greedy ``generate`` with its cache, exactly ``new`` tokens (no stop at EOS)."""
    ids = torch.from_numpy(prompt)
    clock = StepClock()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, use_cache=True, logits_processor=[clock], pad_token_id=0)
    return Timing(clock.times[0] - start, clock.times[-1] - clock.times[0], out[0, prompt.shape[1]:].tolist())


@dataclass
class Variant:
    """One row group: a folder, its export, and the runners on it, each as the arguments of ``make_runner``."""

    name: str
    family: str
    attnres: bool
    parameters: int
    export_s: float
    runners: dict[str, tuple[str, Path, int]]
    times: dict[tuple[str, int], list[Timing]] = field(default_factory=dict)


def make_runner(backend: str, path: Path, threads: int) -> Callable[[np.ndarray, int], tuple]:
    """A worker's runner (``rounds.Workers``), built in the worker: ``path`` is the with-past ONNX of the ONNX
    Runtime backends, the checkpoint folder of ``ours-eager`` and the plain folder of ``transformers``. It returns
    a ``Timing``'s fields (a class of a spawned child's main module does not unpickle in its parent)."""
    from dataclasses import astuple

    from attnres_export.decode.generate import onnx_decoder, torch_decoder
    from attnres_export.models import load_checkpoint

    torch.set_num_threads(threads)
    if backend == "transformers":
        model = load_hf(path)
        return lambda prompt, new: astuple(run_transformers(model, prompt, new))
    decoder = torch_decoder(load_checkpoint(path)[0]) if backend == "ours-eager" else onnx_decoder(path,
                                                                                                    threads=threads)
    return lambda prompt, new: astuple(run_decoder(decoder, prompt, new))


def load_hf(folder: Path):
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


def prepare(family: str, attnres: bool, plain: Path, work: Path, args) -> Variant:
    """Export ``plain`` (or its ``+attnres`` copy) and name its runners."""
    from attnres_export.models import load_checkpoint

    folder = plain
    if attnres:
        folder = work / f"{family}+attnres"
        add_attnres(plain, folder, ATTNRES_BLOCK_LAYERS, seed=1)
    onnx_path = work / f"{folder.name}.with-past.onnx"
    export_s = export_with_past(folder, onnx_path, args.prompt, args.prompt + args.new, max(args.batches))
    fused_path = work / f"{folder.name}.with-past.ort.onnx"
    export_with_past(folder, fused_path, args.prompt, args.prompt + args.new, max(args.batches), "onnxruntime")
    parameters = sum(p.numel() for p in load_checkpoint(folder)[0].parameters())
    runners = {"onnxruntime": ("onnxruntime", onnx_path, args.threads),
               "ort-fused": ("ort-fused", fused_path, args.threads),
               "ours-eager": ("ours-eager", folder, args.threads),
               "transformers": ("transformers", plain, args.threads)}
    return Variant(folder.name, family, attnres, parameters, export_s, runners)


def measure(variants: list[Variant], prompts: dict[int, np.ndarray], args, skip: set[str]) -> None:
    """Every runner of every variant in a worker process of its own (``rounds.Workers``: in one process the order
    models are loaded in moves their speed); warm-up, then ``args.repeats`` rounds, in each, per batch, every runner
    in turn in ``rounds.round_order``."""
    keys = [(v, name) for v in variants for name in v.runners if name not in skip]
    with Workers(make_runner, [v.runners[name] for v, name in keys]) as workers:
        for b, prompt in prompts.items():
            for index, (v, name) in enumerate(keys):
                workers(index, prompt, 2)
                v.times[(name, b)] = []
        for round_ in range(args.repeats):
            for b, prompt in prompts.items():
                for index in round_order(len(keys), round_):
                    v, name = keys[index]
                    v.times[(name, b)].append(Timing(*workers(index, prompt, args.new)))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def header(args, extra: str = "") -> list[str]:
    return [f"# {platform.machine()}, {os.cpu_count()} cores, load average {load_average()}; torch "
            f"{torch.__version__} ({torch.get_num_threads()} threads), onnxruntime {onnxruntime.__version__} "
            f"({args.threads} intra-op threads), transformers {transformers.__version__}",
            f"# prompt {args.prompt} tokens, {args.new} new tokens ({args.new - 1} decode steps), "
            f"{args.repeats} interleaved rounds, medians{extra}"]


def summarize(v: Variant, args) -> list[dict]:
    rows = []
    for b in args.batches:
        stats = {}
        for name in BACKENDS:
            runs = v.times.get((name, b))
            if not runs:
                continue
            stats[name] = {"prefill_ms": statistics.median(r.prefill_s for r in runs) * 1e3,
                           "decode_tokens_per_s": b * (args.new - 1) / statistics.median(r.decode_s for r in runs),
                           "tokens": runs[-1].tokens}
        ort, fused, ours, hf = (stats.get(n) for n in BACKENDS)
        same = {n: sum(a == c for a, c in zip(ort["tokens"], s["tokens"], strict=True))
                for n, s in stats.items() if n != "onnxruntime"}
        rows.append({"variant": v.name, "family": v.family, "attnres": v.attnres, "batch": b,
                     "parameters": v.parameters, "export_s": round(v.export_s, 2),
                     **{f"{n}_{k}": round(s[k], 2) for n, s in stats.items() for k in ("prefill_ms",
                                                                                        "decode_tokens_per_s")},
                     "ort_vs_ours_eager": round(ort["decode_tokens_per_s"] / ours["decode_tokens_per_s"], 3)
                     if ours else None,
                     "ort_vs_transformers": round(ort["decode_tokens_per_s"] / hf["decode_tokens_per_s"], 3)
                     if hf else None,
                     "fused_vs_transformers": round(fused["decode_tokens_per_s"] / hf["decode_tokens_per_s"], 3)
                     if hf and fused else None,
                     "fused_vs_transformers_prefill": round(hf["prefill_ms"] / fused["prefill_ms"], 3)
                     if hf and fused else None,
                     "same_tokens_as_ort": same})
    return rows


def print_tables(rows: list[dict], args, export: str = "portable, with past, no check") -> None:
    """Two 80-column tables: decode tokens/s with the ratios, then prefill ms and export s."""
    def cell(row: dict, key: str) -> str:
        value = row.get(key)
        return "" if value is None else f"{value:,.1f}"

    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}x"

    print("\ndecode tokens/s (all rows of the batch); ORT: the portable target, fused: the onnxruntime target; "
          "ratios over transformers")
    print("| folder | b | ORT | fused | ours eager | transformers | ORT/HF | fused/HF |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['batch']} | {cell(r, 'onnxruntime_decode_tokens_per_s')} | "
              f"{cell(r, 'ort-fused_decode_tokens_per_s')} | "
              f"{cell(r, 'ours-eager_decode_tokens_per_s')} | {cell(r, 'transformers_decode_tokens_per_s')} | "
              f"{ratio(r['ort_vs_transformers'])} | {ratio(r.get('fused_vs_transformers'))} |")
    print(f"\nprefill ms ({args.prompt} tokens); export s ({export}); same greedy tokens as "
          f"ORT out of {args.new}")
    print("| folder | b | ORT | fused | ours | HF | HF/fused | export | same fused/ours/HF |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        same = r["same_tokens_as_ort"]
        print(f"| {r['variant']} | {r['batch']} | {cell(r, 'onnxruntime_prefill_ms')} | "
              f"{cell(r, 'ort-fused_prefill_ms')} | {cell(r, 'ours-eager_prefill_ms')} | "
              f"{cell(r, 'transformers_prefill_ms')} | {ratio(r.get('fused_vs_transformers_prefill'))} | "
              f"{r['export_s']:.1f} | {same.get('ort-fused', '')}/{same.get('ours-eager', '')}/"
              f"{same.get('transformers', '')} |")


def print_attnres_cost(rows: list[dict]) -> None:
    """ONNX Runtime decode of each ``+attnres`` graph over its plain graph, same family, batch and run."""
    plain = {(r["family"], r["batch"]): r for r in rows if not r["attnres"]}
    pairs = [(r, plain[(r["family"], r["batch"])]) for r in rows if r["attnres"] and (r["family"], r["batch"]) in plain]
    if not pairs:
        return
    print("\nONNX Runtime decode, +attnres over plain (same weights but the AttnRes sites)")
    print("| family | b | plain tok/s | +attnres tok/s | +attnres/plain |")
    print("|---|---:|---:|---:|---:|")
    for r, p in pairs:
        a, b = r["onnxruntime_decode_tokens_per_s"], p["onnxruntime_decode_tokens_per_s"]
        print(f"| {r['family']} | {r['batch']} | {b:,.1f} | {a:,.1f} | {a / b:.2f}x |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--no-attnres", action="store_true", help="only the plain folders")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads of torch and ONNX Runtime alike (1: on a shared machine a spinning "
                             "pool also times its neighbours)")
    parser.add_argument("--skip", default="", help="backends to leave out, e.g. ours-eager")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.families = args.families.split(",")
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    widths = sizes(args.hidden, args.layers, args.vocab)
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(3, args.vocab, size=(b, args.prompt), dtype=np.int64) for b in args.batches}
    print("\n".join(header(args)))
    print(f"# widths: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, float32; per family:")
    for family in args.families:
        print(f"#   {family}: " + ", ".join(f"{k} {v}" for k, v in widths[family].items()
                                            if k not in ("vocab_size", "hidden_size", "num_hidden_layers")))
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnres-family-") as tmp:
        for family in args.families:
            plain = Path(tmp) / family
            write_hf_folder(family, hf_config(family, widths[family]), plain, seed=0)
            variants = [prepare(family, attnres, plain, Path(tmp), args)
                        for attnres in ((False,) if args.no_attnres else (False, True))]
            measure(variants, prompts, args, skip)
            family_rows = [r for v in variants for r in summarize(v, args)]
            rows += family_rows
            print(f"# {family}: {variants[0].parameters:,} parameters; load average {load_average()}", flush=True)
            print_tables(family_rows, args)
            sys.stdout.flush()
    print("\n## all families")
    print("\n".join(header(args)))
    print_tables(rows, args)
    print_attnres_cost(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
