"""onnxruntime-genai decode figures: our ``--genai`` folders against the folders onnxruntime-genai's own model builder
makes from the same Hugging Face checkpoint, every folder driven by onnxruntime-genai, in one interleaved run.

For each body (Llama- and Qwen3-style, transformers' ``save_pretrained`` at random init, with a small BPE tokenizer
the builder needs) it makes:
- ``builder``: ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32|fp16 -e cpu``;
- ``ours``: ``attnres-export HF --with-past --target onnxruntime --genai OUT [--dtype float16]`` of the same folder
  (``int4``: with ``--quantize int4 --quantize-embeddings --int8-activations``, ``PRECISIONS``);
- ``ours+attnres``: the same folder with K3's Attention Residuals keys added (``attn_res_block_size`` and the
  per-layer ``*_res_norm``/``*_res_proj`` weights), read as Block AttnRes.
It times prefill (``append_tokens`` of the prompt) and greedy decode (tokens/s over all rows) at each batch, each
round running every folder (each in a process of its own) in turn, rotated and reversed between rounds, so that load
from other processes and a folder's place in the round hit them alike; figures are medians over the rounds; the
ratios (ours / builder and attnres / standard) are the medians of each round's paired ratio. ``--profile`` adds an
ONNX Runtime profile of one decode per folder and batch: kernel time per decode step by op type (the ops that cost
a difference).
Run from the repository root:
    python benchmarks/genai_decode.py [--bodies llama,qwen3] [--precisions fp32,fp16,int4] [--batches 1,8]
        [--prompt 128] [--new 64] [--repeats 3] [--threads N] [--profile] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import torch
from rounds import Workers, in_rounds, paired_median

SIZES = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0}
"""One size for both bodies (grouped-query attention, 2 query heads per key/value head by default)."""
ATTNRES_BLOCK_LAYERS = 2
"""K3's ``attn_res_block_size`` (decoder layers per block): Block AttnRes with 4 sublayers per block."""
PRECISIONS = {"fp32": {"dtype": "float32"}, "fp16": {"dtype": "float16"},
              "int4": {"dtype": "float32", "quantize": "int4", "quantize_embeddings": True, "int8_activations": True}}
"""Our export options per builder ``-p``. The builder's int4 on CPU: round-to-nearest blocks of 32, ``MatMulNBits``
at ``accuracy_level`` 4 (int8 activations), the output head int4; ours: ``--quantize int4 --quantize-embeddings
--int8-activations`` (the embedding table int4 too)."""


@dataclass
class Folder:
    body: str
    precision: str
    kind: str
    """``builder``, ``ours`` or ``ours+attnres``."""
    path: Path


def hf_folder(body: str, out: Path, seed: int, kv_heads: int) -> Path:
    """A transformers checkpoint at random init, with a BPE tokenizer (the builder reads one)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    sizes = SIZES | {"num_key_value_heads": kv_heads}
    if body == "llama":
        model = LlamaForCausalLM(LlamaConfig(**sizes))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**sizes, head_dim=SIZES["hidden_size"] // SIZES["num_attention_heads"]))
    model.save_pretrained(out)
    _tokenizer().save_pretrained(out)
    return out


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def with_attnres_keys(source: Path, out: Path, seed: int) -> Path:
    """``source`` with K3's Attention Residuals keys: random pseudo-queries (std 2/sqrt(D), as ``attnres example``)
    and key-norm gains near 1."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    config["attn_res_block_size"] = ATTNRES_BLOCK_LAYERS
    tensors = load_file(source / "model.safetensors")
    d = config["hidden_size"]
    gen = torch.Generator().manual_seed(seed)

    def pair(prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}_norm.weight": 1.0 + 0.1 * torch.randn(d, generator=gen),
                f"{prefix}_proj.weight": torch.randn(1, d, generator=gen) * (2.0 / d**0.5)}

    for i in range(config["num_hidden_layers"]):
        for prefix in ("self_attention_res", "mlp_res"):
            tensors |= {f"model.layers.{i}.{k}": v for k, v in pair(prefix).items()}
    tensors |= {f"model.{k}": v for k, v in pair("output_attn_res").items()}
    out.mkdir()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((source / name).read_bytes())
    return out


def builder(hf: Path, out: Path, precision: str) -> Path:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", precision,
           "-e", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the model builder failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return out


def ours(source: Path, out: Path, precision: str, max_batch: int) -> Path:
    from attnres_export.dims import DimRange
    from attnres_export.exporter.foreign import ForeignOptions
    from attnres_export.exporter.genai import export_genai
    from attnres_export.exporter.options import ExportOptions

    opts = ExportOptions(source, target="portable", with_past=True, batch=DimRange(1, 1, max_batch),
                         **PRECISIONS[precision])
    result = export_genai(opts, out, ForeignOptions({}, False, False, [], None))
    if result.report is not None and not result.report.ok:
        raise SystemExit(f"{source}: the with-past export missed its parity bar")
    return out


def load(folder: Path, threads: int | None, profile: str | None = None) -> og.Model:
    config = og.Config(str(folder))
    session: dict = {}
    if threads:
        session["intra_op_num_threads"] = threads
    if profile:
        session["enable_profiling"] = profile
    if session:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
    return og.Model(config)


def generator(folder: Path, threads: int | None) -> Callable[[np.ndarray, int], tuple[float, float, list[int]]]:
    """A worker's runner (``rounds.Workers``): the folder's model, loaded in the worker, generating greedily."""
    model = load(folder, threads)
    return lambda prompt, new: generate(model, prompt, new)


def generate(model: og.Model, prompt: np.ndarray, new: int) -> tuple[float, float, list[int]]:
    """(prefill s, decode tokens/s over all rows, first row's new tokens) of one greedy generation."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.shape[1] + new, do_sample=False, batch_size=prompt.shape[0])
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt)
    prefill = time.perf_counter() - start
    steps = 0
    start = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    decode = time.perf_counter() - start
    tokens = [int(t) for t in generator.get_sequence(0)[prompt.shape[1]:]]
    return prefill, prompt.shape[0] * (steps - 1) / decode, tokens


def prompt_ids(batch: int, length: int) -> np.ndarray:
    return np.random.default_rng([batch, length]).integers(3, SIZES["vocab_size"], (batch, length)).astype(np.int32)


def profile_main(folder: str, batch: int, length: int, new: int, threads: int, prefix: str) -> None:
    """Child process: one generation with ONNX Runtime's profiler on (it writes its file at exit)."""
    model = load(Path(folder), threads or None, prefix)
    generate(model, prompt_ids(batch, length), new)


def op_times(folder: Path, batch: int, args, scratch: Path) -> dict[str, float]:
    """Kernel microseconds per decode step by op type (the prefill run left out)."""
    prefix = str(scratch / f"profile-{folder.name}-{batch}")
    subprocess.run([sys.executable, __file__, "--profile-child", str(folder), str(batch), str(args.prompt),
                    str(min(args.new, 32)), str(args.threads), prefix], check=True)
    events = json.loads(next(scratch.glob(f"profile-{folder.name}-{batch}*.json")).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    prefill_end = runs[0]["ts"] + runs[0]["dur"]
    totals: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] > prefill_end:
            totals[event["args"]["op_name"]] += event["dur"]
    return {op: us / (len(runs) - 1) for op, us in totals.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bodies", default="llama,qwen3")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: its default)")
    parser.add_argument("--kv-heads", type=int, default=SIZES["num_key_value_heads"],
                        help="key/value heads (of 8 query heads); the builder's fp16 CPU graph fails with fewer than 8")
    parser.add_argument("--profile", action="store_true", help="per-op kernel time of a decode, every folder")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile-child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile_child:
        folder, batch, length, new, threads, prefix = args.profile_child
        profile_main(folder, int(batch), int(length), int(new), int(threads), prefix)
        return
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory(prefix="attnres-genai-") as tmp:
        scratch = Path(tmp)
        folders, notes = build_folders(args, batches, scratch)
        results = measure(folders, batches, args, notes)
        profiles = ({f"{f.body}/{f.precision}/{f.kind}/b{b}": op_times(f.path, b, args, scratch)
                     for i, f in enumerate(folders) for b in batches if (i, b) in results} if args.profile else {})
    report(folders, results, profiles, notes, args)


def build_folders(args, batches: list[int], scratch: Path) -> tuple[list[Folder], list[str]]:
    folders: list[Folder] = []
    notes: list[str] = []
    for body in args.bodies.split(","):
        hf = hf_folder(body, scratch / f"{body}-hf", seed=0, kv_heads=args.kv_heads)
        attnres = with_attnres_keys(hf, scratch / f"{body}-k3", seed=1)
        for precision in args.precisions.split(","):
            start = time.perf_counter()
            folders.append(Folder(body, precision, "builder", builder(hf, scratch / f"{body}-{precision}-builder",
                                                                      precision)))
            notes.append(f"{body} {precision}: builder {time.perf_counter() - start:.0f} s")
            for kind, source in (("ours", hf), ("ours+attnres", attnres)):
                start = time.perf_counter()
                folders.append(Folder(body, precision, kind, ours(source, scratch / f"{body}-{precision}-{kind}",
                                                                  precision, max(batches))))
                notes.append(f"{body} {precision}: {kind} export {time.perf_counter() - start:.0f} s")
    return folders, notes


def measure(folders: list[Folder], batches: list[int], args, notes: list[str]) -> dict[tuple[int, int], dict]:
    """Per (folder index, batch): median prefill ms, median decode tokens/s, the first row's tokens, every round's
    figures (for ``paired``). Each folder runs in a worker process of its own (``rounds.Workers``: in one process the
    order models are loaded in moves their speed); each round runs the folders in turn, in ``rounds.round_order`` (a
    folder's place in the round favours none). A folder that fails to generate at a batch is left out there, with a
    note."""
    samples: dict[tuple[int, int], list[tuple[float, float, list[int]]]] = {}
    with Workers(generator, [(f.path, args.threads or None) for f in folders]) as workers:
        for batch in batches:
            prompt = prompt_ids(batch, args.prompt)

            def failed(i: int, exc: RuntimeError, batch: int = batch) -> None:
                folder = folders[i]
                notes.append(f"{folder.body} {folder.precision} {folder.kind} batch {batch}: onnxruntime-genai "
                             f"fails ({str(exc).splitlines()[0][:300]})")

            for i, runs in enumerate(in_rounds(workers, args.repeats, prompt, args.new, failed)):
                if runs:
                    samples[i, batch] = runs
    return {key: {"prefill_ms": 1e3 * statistics.median(s[0] for s in runs),
                  "decode_tokens_per_s": statistics.median(s[1] for s in runs), "tokens": runs[-1][2],
                  "rounds": [(s[0], s[1]) for s in runs]}
            for key, runs in samples.items()}


def paired(run: dict, base: dict, index: int) -> float:
    """The median over the rounds of ``run``'s figure ``index`` (0 prefill s, 1 decode tokens/s) over ``base``'s in
    the same round: load that moves during the run hits both sides of each ratio alike."""
    return paired_median([r[index] for r in run["rounds"]], [r[index] for r in base["rounds"]])


def report(folders: list[Folder], results: dict, profiles: dict, notes: list[str], args) -> None:
    print(f"onnxruntime-genai {og.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.kv_heads} key/value heads, threads {args.threads or 'default'}, prompt {args.prompt}, "
          f"{args.new} new tokens, medians of {args.repeats} rounds; ratios: medians of the rounds' paired ratios")
    for note in notes:
        print("  " + note)
    print(f"{'body':6} {'prec':5} {'folder':13} {'batch':>5} {'prefill ms':>11} {'decode tok/s':>13} "
          f"{'vs builder':>11} {'vs ours':>8} {'same tokens':>12}")
    rows = [_row(folders, results, i, batch) for i, batch in
            sorted(results, key=lambda key: (folders[key[0]].body, folders[key[0]].precision, key[1], key[0]))]
    for row in rows:
        same = row["same_tokens_as_builder"]
        print(f"{row['body']:6} {row['precision']:5} {row['folder']:13} {row['batch']:5d} {row['prefill_ms']:11.1f} "
              f"{row['decode_tokens_per_s']:13.1f} {_ratio(row['decode_vs_builder']):>11} "
              f"{_ratio(row['decode_vs_ours']):>8} {'' if same is None else f'{same}/{args.new}':>12}")
    for key, ops in profiles.items():
        top = ", ".join(f"{op} {us / 1e3:.2f}" for op, us in list(ops.items())[:8])
        print(f"profile {key}: {sum(ops.values()) / 1e3:.2f} ms kernel time per decode step; {top} (ms)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "profiles": profiles, "notes": notes}, indent=2))


def _row(folders: list[Folder], results: dict, index: int, batch: int) -> dict:
    """One folder at one batch, with its ratios to the builder's folder and (AttnRes) to ours without AttnRes."""
    folder, result = folders[index], results[index, batch]
    peers = {f.kind: results[j, batch] for j, f in enumerate(folders)
             if (f.body, f.precision) == (folder.body, folder.precision) and (j, batch) in results}
    base, standard = peers.get("builder"), peers.get("ours")
    compared = base is not None and folder.kind != "builder"
    return {
        "body": folder.body, "precision": folder.precision, "folder": folder.kind, "batch": batch,
        "prefill_ms": round(result["prefill_ms"], 2), "decode_tokens_per_s": round(result["decode_tokens_per_s"], 2),
        "decode_vs_builder": round(paired(result, base, 1), 3) if compared else None,
        "prefill_vs_builder": round(paired(result, base, 0), 3) if compared else None,
        "decode_vs_ours": round(paired(result, standard, 1), 3)
        if standard is not None and folder.kind == "ours+attnres" else None,
        "same_tokens_as_builder": sum(a == b for a, b in zip(result["tokens"], base["tokens"], strict=False))
        if compared else None,
    }


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


if __name__ == "__main__":
    main()
