"""Weight-only quantized exports on ONNX Runtime CPU, in one run: decode tokens/s, file sizes, export peak memory.

1. Per body (Llama- and Qwen3-shaped, transformers' ``save_pretrained`` at random init in float32, with the small BPE
   tokenizer onnxruntime-genai's builder reads; ``--size`` picks the widths), with-past exports
   (``attnres-export HF --with-past --target portable --no-check``):
   - ``fp32``: float32, the baseline;
   - ``int4``: ``--quantize int4`` (block 32; float32 activations graph), timed on ONNX Runtime with
     ``session.qdq_matmulnbits_accuracy_level`` 1 (attnres' own sessions: float32 activations) and 4 (ONNX Runtime's
     default: int8 activations);
   - ``int4+emb``: ``--quantize int4 --quantize-embeddings`` (the table and the output head too), the same two
     levels (the builder quantizes its output head, so this is its like-for-like);
   - ``fp16`` and ``int4+emb fp16``: ``--dtype float16`` without and with ``--quantize int4 --quantize-embeddings``,
     for the file sizes only;
   - ``int4+emb ort``: the same quantization exported for the ``onnxruntime`` target (``MatMulNBits`` written with
     ``accuracy_level`` 1, ``GroupQueryAttention``, ``RotaryEmbedding``, fused norms; docs/onnxruntime-target.md);
   - ``int4+emb ort a8``: the same with ``--int8-activations`` (``MatMulNBits`` written with ``accuracy_level`` 4,
     the builder's; docs/quantization.md#int8-activations);
   - ``int4+emb genai a8``: the same export as a ``--genai`` folder, run by onnxruntime-genai as the builder's is
     (its C++ loop and its cache buffers instead of attnres' Python ``Decoder``: the like-for-like comparison);
   - ``builder``: ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu`` (its defaults on CPU:
     RTN block 32, MatMulNBits ``accuracy_level`` 4), run by onnxruntime-genai.
   Decode tokens/s (greedy, fixed random prompt, ``--new`` tokens: one prefill then ``--new - 1`` cached steps, all
   rows counted) at each batch; each round runs every model in turn (rotated and reversed between rounds) so that
   load from other processes and a model's place in the round hit them alike; medians over the rounds, and each
   ratio the median of the rounds' paired ratios. Greedy-token agreement of the first row with the builder's over
   ``--new`` tokens is printed as information (the two quantize differently). The ``fp32`` and ``int4`` exports run
   in a child process whose peak resident set (``VmHWM``, ``export_memory.run_child``) is the export peak memory.
2. Kimi K3 layout: ``attnres example K3 --arch kimi-k3 --layers N`` (routed experts in MXFP4, compressed-tensors)
   exported as published (kept quantized: INT8 values -12..12 and float32 E8M0 scales per 32 in
   ``DequantizeLinear``), against a dequantized copy of the same folder (each MXFP4 weight read through the store,
   ``quantized_view(...)[name].read(torch.bfloat16)``, written as bfloat16 under the published name, no
   ``quantization_config``): expert bytes in the ONNX file (the initializers every ``DequantizeLinear`` reads,
   subgraphs included) against the same experts in bfloat16 (2 bytes per parameter), and decode tokens/s of both
   with-past exports.
Run from the repository root:
    python benchmarks/quantized_decode.py [--size 0.5b|0.1b|tiny] [--bodies llama,qwen3] [--batches 1,8]
        [--prompt 32] [--new 32] [--repeats 3] [--threads 1] [--k3-layers 7] [--no-k3] [--json OUT.json]
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
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import onnxruntime_genai as og
import torch
from export_memory import run_child
from family_decode import run_decoder as family_run_decoder
from genai_decode import _tokenizer
from genai_decode import generate as genai_generate
from genai_decode import load as genai_load
from rounds import Workers, in_rounds, paired_median

SIZES = {
    "0.5b": {"hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 4096, "num_attention_heads": 16,
             "num_key_value_heads": 8, "vocab_size": 32000},
    "0.1b": {"hidden_size": 768, "num_hidden_layers": 10, "intermediate_size": 2560, "num_attention_heads": 12,
             "num_key_value_heads": 4, "vocab_size": 32000},
    "tiny": {"hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096},
}
"""Widths laid over both bodies (heads of 64; Qwen3 adds its q/k norms); untied embeddings, as the builder's output
head is then a separate MatMul."""
COMMON = {"max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "bos_token_id": 1,
          "eos_token_id": 2, "rope_theta": 10000.0}
ACCURACY_KEY = "session.qdq_matmulnbits_accuracy_level"
"""``attnres_export.backends.onnxruntime.runner.MATMUL_ACCURACY_KEY``."""
QUANTIZED_RUNS = ("int4 a1", "int4 a4", "int4+emb a1", "int4+emb a4", "int4+emb ort", "int4+emb ort a8",
                  "int4+emb genai a8")
"""The quantized models timed, in table order (each against fp32 and the builder)."""
GOALS = {"int4_vs_fp32_b1": 2.0, "ours_vs_builder": 1.0, "size_vs_fp16": 0.3}
MIB = 2**20


def hf_folder(body: str, size: dict, out: Path, seed: int) -> int:
    """A float32 transformers checkpoint at random init with a BPE tokenizer; returns its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    keys = COMMON | size
    if body == "llama":
        model = LlamaForCausalLM(LlamaConfig(**keys))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**keys, head_dim=size["hidden_size"] // size["num_attention_heads"]))
    model.save_pretrained(out, max_shard_size="50GB")
    _tokenizer().save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def export_args(folder: Path, out: Path, args, *extra: str, target: str = "portable", genai: bool = False
                ) -> list[str]:
    """``attnres-export``'s arguments; ``genai``: ``out`` is a ``--genai`` folder, else the ONNX file."""
    return [str(folder), "--genai" if genai else "-o", str(out), "--with-past", "--target", target, "--no-check",
            "--batch", f"1:1:{max(args.batches)}", "--seq", f"1:1:{args.prompt}",
            "--past", f"0:{args.prompt}:{args.prompt + args.new}", *extra]


def export(folder: Path, out: Path, args, *extra: str, target: str = "portable", genai: bool = False) -> dict:
    """``attnres-export`` in a child process: its wall time and peak RSS (``VmHWM``)."""
    result = run_child("export", *export_args(folder, out, args, *extra, target=target, genai=genai))
    return {"wall_s": result["wall"], "peak_rss_mib": result["maxrss_kib"] / 1024, "bytes": onnx_bytes(out)}


def onnx_bytes(out: Path) -> int:
    """The ONNX file and its external data (``OUT.onnx*`` beside it, or every ``*.onnx*`` of a folder)."""
    files = out.glob("*.onnx*") if out.is_dir() else out.parent.glob(f"{out.name}*")
    return sum(f.stat().st_size for f in files)


def builder(hf: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out), "-p", "int4",
           "-e", "cpu"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the model builder failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
    return {"wall_s": time.perf_counter() - start, "bytes": onnx_bytes(out), "cmd": " ".join(cmd)}


def ort_decoder(path: Path, threads: int, accuracy: int):
    """``attnres_export.decode.generate.onnx_decoder`` with the ``MatMulNBits`` accuracy level set."""
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
    from attnres_export.decode.generate import Decoder
    from attnres_export.graphs.load import load_onnx
    from attnres_export.graphs.metadata import export_info, input_axes
    from attnres_export.models.base import PAST_PREFIX

    graph = load_onnx(path, load_external_data=False)
    runner = OnnxRuntimeRunner(path, artifact=path.name, threads=threads, matmul_accuracy=accuracy)
    dtypes = {v.name: np.float16 if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32
              for v in graph.graph.input if v.name.startswith(PAST_PREFIX)}
    return Decoder(runner, input_axes(graph), runner.backend, export_info(graph), dtypes)


def run_decoder(decoder, prompt: np.ndarray, new: int) -> tuple[float, list[int]]:
    """Decode tokens/s over all rows (prefill at past 0, then ``new - 1`` cached steps) and the first row's tokens,
    timed as family_decode.py times our decoders."""
    timing = family_run_decoder(decoder, prompt, new)
    return prompt.shape[0] * (new - 1) / timing.decode_s, timing.tokens


def run_genai(model, prompt: np.ndarray, new: int) -> tuple[float, list[int]]:
    _, tokens_per_s, tokens = genai_generate(model, prompt.astype(np.int32), new)
    return tokens_per_s, tokens


def make_runner(kind: str, path: Path, threads: int, accuracy: int) -> Callable[[np.ndarray, int], tuple]:
    """A worker's runner (``rounds.Workers``), built in the worker: ``genai`` an onnxruntime-genai folder, ``ort``
    our decoder on a with-past ONNX at ``MatMulNBits`` accuracy level ``accuracy``."""
    if kind == "genai":
        model = genai_load(path, threads)
        return lambda prompt, new: run_genai(model, prompt, new)
    decoder = ort_decoder(path, threads, accuracy)
    return lambda prompt, new: run_decoder(decoder, prompt, new)


def measure(runners: dict[str, tuple], prompts: dict[int, np.ndarray], args, notes: list[str]
            ) -> dict[tuple[str, int], dict]:
    """Every runner (``make_runner``'s arguments) in a worker process of its own (``rounds.Workers``: in one process
    the order models are loaded in moves their speed); warm-up, then ``args.repeats`` rounds of every runner in turn
    per batch (in ``rounds.round_order``, so that a runner's place in the round favours none); a runner that fails
    at a batch is left out there with a note. Each result keeps its rounds' tokens/s for the paired ratios
    (``paired``)."""
    samples: dict[tuple[str, int], list] = {}
    names = list(runners)
    with Workers(make_runner, list(runners.values())) as workers:
        for b, prompt in prompts.items():

            def failed(index: int, exc: RuntimeError, b: int = b) -> None:  # reported in the notes, not hidden
                notes.append(f"{names[index]} batch {b}: fails ({str(exc).strip().splitlines()[0][:300]})")

            for index, runs in enumerate(in_rounds(workers, args.repeats, prompt, args.new, failed)):
                if runs:
                    samples[names[index], b] = runs
    return {key: {"tokens_per_s": statistics.median(s[0] for s in runs), "rounds": [s[0] for s in runs],
                  "tokens": runs[-1][1]} for key, runs in samples.items()}


def body_rows(body: str, args, work: Path, prompts: dict[int, np.ndarray], notes: list[str]) -> dict:
    size = SIZES[args.size]
    hf = work / f"{body}-hf"
    params = hf_folder(body, size, hf, seed=0)
    print(f"# {body}: {params / 1e9:.3f}B parameters, float32 folder written", flush=True)
    exports = {}
    plans = {"fp32": (), "int4": ("--quantize", "int4"), "int4+emb": ("--quantize", "int4", "--quantize-embeddings"),
             "fp16": ("--dtype", "float16"),
             "int4+emb fp16": ("--dtype", "float16", "--quantize", "int4", "--quantize-embeddings"),
             "int4+emb ort": ("--quantize", "int4", "--quantize-embeddings"),
             "int4+emb ort a8": ("--quantize", "int4", "--quantize-embeddings", "--int8-activations"),
             "int4+emb genai a8": ("--quantize", "int4", "--quantize-embeddings", "--int8-activations")}
    for name, extra in plans.items():
        genai = "genai" in name
        out = work / f"{body}-{name.replace(' ', '-').replace('+', '_')}{'' if genai else '.onnx'}"
        target = "onnxruntime" if " ort" in name or genai else "portable"
        exports[name] = export(hf, out, args, *extra, target=target, genai=genai) | {"path": out}
        print(f"#   {name}: exported in {exports[name]['wall_s']:.0f} s, peak RSS "
              f"{exports[name]['peak_rss_mib']:,.0f} MiB, {exports[name]['bytes'] / MIB:,.1f} MiB", flush=True)
    exports["builder"] = builder(hf, work / f"{body}-builder") | {"path": work / f"{body}-builder"}
    print(f"#   builder: {exports['builder']['wall_s']:.0f} s, {exports['builder']['bytes'] / MIB:,.1f} MiB",
          flush=True)
    runners = {name: ("ort", exports[export_name]["path"], args.threads, accuracy)
               for name, export_name, accuracy in (("fp32", "fp32", 1), ("int4 a1", "int4", 1), ("int4 a4", "int4", 4),
                                                   ("int4+emb a1", "int4+emb", 1), ("int4+emb a4", "int4+emb", 4),
                                                   ("int4+emb ort", "int4+emb ort", 1),
                                                   ("int4+emb ort a8", "int4+emb ort a8", 1))}
    runners |= {name: ("genai", exports[name]["path"], args.threads, 1) for name in ("int4+emb genai a8", "builder")}
    body_notes: list[str] = []
    results = measure(runners, prompts, args, body_notes)
    notes += [f"{body} {n}" for n in body_notes]
    return {"body": body, "parameters": params, "exports": {k: {x: y for x, y in v.items() if x != "path"}
                                                            for k, v in exports.items()},
            "decode": {f"{name} b{b}": r for (name, b), r in results.items()}}


def dequantized_copy(source: Path, out: Path) -> int:
    """``source`` with every quantized weight read through the store and written in bfloat16 under its published
    name, without ``quantization_config``; returns the number of weights dequantized."""
    from safetensors.torch import save_file

    from attnres_export.models.store.files import safetensors_tensors
    from attnres_export.models.store.quantized import QuantizedTensor, quantization_config_of, quantized_view

    config = json.loads((source / "config.json").read_text())
    view = quantized_view(safetensors_tensors(source), quantization_config_of(config), str(source))
    tensors = {name: t.read(torch.bfloat16) if isinstance(t, QuantizedTensor) else t.read()
               for name, t in view.items()}
    config.pop("quantization_config", None)
    config.get("text_config", {}).pop("quantization_config", None)
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return sum(isinstance(t, QuantizedTensor) for t in view.values())


def dequantize_linear_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the initializers every ``DequantizeLinear`` reads, directly or through the ``Gather`` of the chosen
    experts, subgraphs included; the logical elements of its values)."""
    model = onnx.load(str(path), load_external_data=False)
    init = {t.name: t for t in model.graph.initializer}
    producers: dict[str, onnx.NodeProto] = {}
    dequantize: list[onnx.NodeProto] = []

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            producers.update(dict.fromkeys(node.output, node))
            if node.op_type == "DequantizeLinear":
                dequantize.append(node)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    def source(name: str) -> str | None:
        while name not in init:
            node = producers.get(name)
            if node is None or node.op_type not in ("Gather", "Identity", "Reshape", "Transpose"):
                return None
            name = node.input[0]
        return name

    walk(model.graph)
    used = {s for node in dequantize for s in map(source, node.input) if s is not None}
    values = {s for node in dequantize if (s := source(node.input[0])) is not None}
    return sum(tensor_bytes(init[n]) for n in used), sum(int(np.prod(init[n].dims)) for n in values)


def tensor_bytes(t: onnx.TensorProto) -> int:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return int({e.key: e.value for e in t.external_data}["length"])
    if t.raw_data:
        return len(t.raw_data)
    return onnx.numpy_helper.to_array(t).nbytes


def k3_rows(args, work: Path, notes: list[str]) -> dict:
    k3, plain = work / "k3-mxfp4", work / "k3-bf16-experts"
    cmd = ["attnres", "example", str(k3), "--arch", "kimi-k3", "--layers", str(args.k3_layers)]
    subprocess.run(cmd, check=True, capture_output=True)
    dequantized = dequantized_copy(k3, plain)
    vocab = json.loads((k3 / "config.json").read_text())["text_config"]["vocab_size"]
    exports = {}
    for name, folder in (("mxfp4", k3), ("bf16 experts", plain)):
        out = work / f"k3-{name.replace(' ', '-')}.onnx"
        exports[name] = export(folder, out, args) | {"path": out}
        print(f"# k3 {name}: exported in {exports[name]['wall_s']:.0f} s, peak RSS "
              f"{exports[name]['peak_rss_mib']:,.0f} MiB, {exports[name]['bytes'] / MIB:,.2f} MiB", flush=True)
    quantized_bytes, elements = dequantize_linear_bytes(exports["mxfp4"]["path"])
    rng = np.random.default_rng(1)
    prompts = {b: rng.integers(3, vocab, size=(b, args.prompt), dtype=np.int64) for b in args.batches}
    runners = {name: ("ort", exports[name]["path"], args.threads, 1) for name in exports}
    k3_notes: list[str] = []
    results = measure(runners, prompts, args, k3_notes)
    notes += [f"k3 {n}" for n in k3_notes]
    return {"cmd": " ".join(cmd), "dequantized_weights": dequantized, "expert_parameters": elements,
            "expert_bytes_onnx": quantized_bytes, "expert_bytes_bf16": 2 * elements,
            "expert_bytes_mxfp4_safetensors": elements // 2 + elements // 32,
            "exports": {k: {x: y for x, y in v.items() if x != "path"} for k, v in exports.items()},
            "decode": {f"{name} b{b}": r for (name, b), r in results.items()}}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ratio(a: float | None, b: float | None) -> str:
    return "" if not a or not b else f"{a / b:.2f}x"


def paired(run: dict | None, base: dict | None) -> float | None:
    """The median over the rounds of ``run``'s tokens/s over ``base``'s in the same round: load that moves during
    the run hits both sides of each ratio alike."""
    if not run or not base:
        return None
    return paired_median(run["rounds"], base["rounds"])


def paired_cell(run: dict | None, base: dict | None) -> str:
    value = paired(run, base)
    return "" if value is None else f"{value:.2f}x"


def met(value: float, goal: float, above: bool) -> str:
    return "met" if (value >= goal if above else value <= goal) else "missed"


def report(bodies: list[dict], k3: dict | None, notes: list[str], args) -> None:
    size = SIZES[args.size]
    print(f"\n# {platform.machine()}, {os.cpu_count()} cores (shared), load average {load_average()}; onnxruntime "
          f"{onnxruntime.__version__} ({args.threads} intra-op threads), onnxruntime-genai {og.__version__}")
    print(f"# size {args.size}: " + ", ".join(f"{k} {v}" for k, v in size.items())
          + f"; prompt {args.prompt}, {args.new} new tokens ({args.new - 1} decode steps), medians of "
            f"{args.repeats} interleaved rounds; ratios: medians of the rounds' paired ratios")
    for note in notes:
        print(f"#   note: {note}")
    print("\ndecode tokens/s (all rows), ONNX Runtime CPU; a1/a4: MatMulNBits accuracy_level 1 (float32 activations) "
          "/ 4 (int8 activations); ort: the onnxruntime target (accuracy_level 1; ort a8: written with "
          "--int8-activations, accuracy_level 4); genai a8: that export as a --genai folder, and builder: both run by "
          "onnxruntime-genai; same: "
          "greedy tokens equal to the builder's (row 0)")
    print("| body | params | model | " + " | ".join(f"b{b} tok/s | vs fp32 | vs builder" for b in args.batches)
          + f" | same/{args.new} |")
    print("|---|---:|---|" + "---:|---:|---:|" * len(args.batches) + "---:|")
    for body in bodies:
        d = body["decode"]
        for name in ("fp32", *QUANTIZED_RUNS, "builder"):
            cells = []
            for b in args.batches:
                r, base, ref = d.get(f"{name} b{b}"), d.get(f"fp32 b{b}"), d.get(f"builder b{b}")
                tps = r["tokens_per_s"] if r else None
                cells.append(f"{tps:,.1f}" if tps else "fails")
                cells.append(paired_cell(r, base) if name != "fp32" else "")
                cells.append(paired_cell(r, ref) if name != "builder" else "")
            r1, ref1 = d.get(f"{name} b{args.batches[0]}"), d.get(f"builder b{args.batches[0]}")
            same = (sum(a == c for a, c in zip(r1["tokens"], ref1["tokens"], strict=False))
                    if r1 and ref1 and name != "builder" else "")
            print(f"| {body['body']} | {body['parameters'] / 1e9:.3f}B | {name} | " + " | ".join(cells)
                  + f" | {same} |")
    print("\nfiles (ONNX + external data) and export (child process: wall, peak RSS)")
    print("| body | export | MiB | vs fp16 | vs builder | export s | peak RSS MiB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for body in bodies:
        e = body["exports"]
        for name in ("fp32", "int4", "int4+emb", "fp16", "int4+emb fp16", "int4+emb ort", "int4+emb ort a8",
                     "int4+emb genai a8", "builder"):
            x = e[name]
            rss = f"{x['peak_rss_mib']:,.0f}" if "peak_rss_mib" in x else ""
            print(f"| {body['body']} | {name} | {x['bytes'] / MIB:,.1f} | {ratio(x['bytes'], e['fp16']['bytes'])} | "
                  f"{ratio(x['bytes'], e['builder']['bytes']) if name != 'builder' else ''} | {x['wall_s']:.0f} | "
                  f"{rss} |")
    print("\ngoals")
    b1 = args.batches[0]
    for body in bodies:
        d, e = body["decode"], body["exports"]
        for name in QUANTIZED_RUNS:
            over_fp32 = paired(d.get(f"{name} b{b1}"), d.get(f"fp32 b{b1}"))
            if over_fp32:
                print(f"- {body['body']} {name} over fp32 at b{b1}: {over_fp32:.2f}x (goal >= "
                      f"{GOALS['int4_vs_fp32_b1']}x: {met(over_fp32, GOALS['int4_vs_fp32_b1'], True)})")
            for b in args.batches:
                over_builder = paired(d.get(f"{name} b{b}"), d.get(f"builder b{b}"))
                if over_builder and (b == b1 or "genai" in name):
                    print(f"- {body['body']} {name} over builder at b{b}: {over_builder:.2f}x (goal >= "
                          f"{GOALS['ours_vs_builder']}x: {met(over_builder, GOALS['ours_vs_builder'], True)})")
        size_ratio = e["int4+emb fp16"]["bytes"] / e["fp16"]["bytes"]
        print(f"- {body['body']} int4+emb fp16 file over fp16: {size_ratio:.3f}x (goal <= {GOALS['size_vs_fp16']}x: "
              f"{met(size_ratio, GOALS['size_vs_fp16'], False)}); over the builder's: "
              f"{e['int4+emb fp16']['bytes'] / e['builder']['bytes']:.2f}x")
        print(f"- {body['body']} export peak RSS int4 over fp32: "
              f"{e['int4']['peak_rss_mib'] / e['fp32']['peak_rss_mib']:.2f}x "
              f"({e['int4']['peak_rss_mib']:,.0f} / {e['fp32']['peak_rss_mib']:,.0f} MiB)")
    if k3 is None:
        return
    print(f"\nKimi K3 layout: `{k3['cmd']}` (tiny: hidden 64, 8 experts of 32), routed experts MXFP4; "
          f"`bf16 experts`: the same folder, its {k3['dequantized_weights']} MXFP4 weights dequantized by the store "
          "and written as bfloat16")
    p = k3["expert_parameters"]
    print(f"routed-expert parameters {p:,}: in the MXFP4 export's ONNX {k3['expert_bytes_onnx']:,} bytes "
          f"(INT8 values + float32 scales, {k3['expert_bytes_onnx'] / p:.3f} bytes/param) = "
          f"{k3['expert_bytes_onnx'] / k3['expert_bytes_bf16']:.3f}x of bfloat16 ({k3['expert_bytes_bf16']:,} bytes); "
          f"the safetensors MXFP4 parts {k3['expert_bytes_mxfp4_safetensors']:,} bytes")
    print("| folder | ONNX MiB | export s | peak RSS MiB | " + " | ".join(f"b{b} tok/s | vs bf16 experts"
                                                                        for b in args.batches) + " |")
    print("|---|---:|---:|---:|" + "---:|---:|" * len(args.batches))
    for name, x in k3["exports"].items():
        cells = []
        for b in args.batches:
            r, base = k3["decode"].get(f"{name} b{b}"), k3["decode"].get(f"bf16 experts b{b}")
            cells += [f"{r['tokens_per_s']:,.1f}" if r else "fails",
                      paired_cell(r, base)
                      if name != "bf16 experts" else ""]
        print(f"| {name} | {x['bytes'] / MIB:,.2f} | {x['wall_s']:.0f} | {x['peak_rss_mib']:,.0f} | "
              + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.5b", choices=SIZES)
    parser.add_argument("--bodies", default="llama,qwen3")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="ONNX Runtime intra-op threads (1: on a shared machine a spinning pool also times its "
                             "neighbours)")
    parser.add_argument("--k3-layers", type=int, default=7)
    parser.add_argument("--no-k3", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    vocab = SIZES[args.size]["vocab_size"]
    rng = np.random.default_rng(0)
    prompts = {b: rng.integers(3, vocab, size=(b, args.prompt), dtype=np.int64) for b in args.batches}
    notes: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attnres-quantized-") as tmp:
        bodies = [body_rows(body, args, Path(tmp), prompts, notes) for body in filter(None, args.bodies.split(","))]
        k3 = None if args.no_k3 else k3_rows(args, Path(tmp), notes)
    notes.append(f"whole run {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"bodies": bodies, "k3": k3, "notes": notes}, indent=2))
    report(bodies, k3, notes, args)


if __name__ == "__main__":
    main()
