"""``attnres generate``: greedy or sampled generation with a KV cache on PyTorch, ONNX Runtime or TensorRT."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from attnres_export.cli.framework import app, command, console, err_console
from attnres_export.cli.options import AllowEngineHostCode, Plugin
from attnres_export.errors import AttnresError

MAX_TOKENIZER_BYTES = 128 << 20
"""The largest published tokenizer.json files are tens of MB; a larger one is not read."""


@command(app)
def generate(
    model: Annotated[Path, typer.Argument(
        help="Checkpoint of a family that generates text (.pt or folder: attnres-lm, Llama, Qwen, DeepSeek-V3, "
             "Kimi Linear).")],
    ids: Annotated[str | None, typer.Option(help="Prompt token ids, comma-separated, e.g. 1,2,3.")] = None,
    prompt: Annotated[str | None, typer.Option(
        help="Prompt text, encoded by the tokenizer.json beside MODEL (Hugging Face tokenizers).")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate.")] = 16,
    onnx: Annotated[Path | None, typer.Option(
        "--onnx", help="Run this with-past ONNX on ONNX Runtime CPU (attnres-export MODEL --with-past).")] = None,
    engine: Annotated[Path | None, typer.Option(help="Run this TensorRT engine (built from a with-past ONNX).")] =
    None,
    plugin: Plugin = None,
    allow_engine_host_code: AllowEngineHostCode = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample among the K most likely tokens (0 = all).")] = 0,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Seed of the sampler.")] = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="ONNX Runtime intra-op threads [one per core].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print {\"tokens\": [...], ...} as JSON.")] = False,
) -> None:
    """Generate tokens after a prompt: PyTorch by default, or a with-past ONNX / TensorRT engine."""
    if onnx is not None and engine is not None:
        raise AttnresError("pass --onnx or --engine, not both")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads is not None and threads > cores:
        raise AttnresError(f"--threads {threads}: this machine gives the process {cores} cores; use at most {cores}")
    if (ids is None) == (prompt is None):
        raise AttnresError("pass exactly one of --ids and --prompt")
    from attnres_export.decode.generate import Sampling, engine_decoder, onnx_decoder, torch_decoder
    from attnres_export.decode.generate import generate as run_generate
    from attnres_export.models import load_checkpoint

    sampling = Sampling(temperature, top_k, seed)
    tokenizer = load_tokenizer(model) if prompt is not None else None
    tokens = tokenizer.encode(prompt).ids if tokenizer is not None else parse_ids(ids)
    torch_model, cfg = load_checkpoint(model)
    if onnx is not None:
        decoder = onnx_decoder(onnx, threads, torch_model, str(model))
    elif engine is not None:
        decoder = engine_decoder(engine, plugin, allow_engine_host_code)
    else:
        decoder = torch_decoder(torch_model)
    for warning in decoder.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    if decoder.max_seq_len is None:
        decoder.max_seq_len = cfg.max_seq_len
    try:
        result = run_generate(decoder, tokens, max_new_tokens, sampling, cfg.vocab_size)
    finally:
        decoder.close()
    payload = result.to_dict()
    if tokenizer is not None:
        payload["text"] = tokenizer.decode(result.tokens)
    if as_json:
        print(json.dumps(payload))
        return
    console.print(f"{result.backend}: {' '.join(map(str, result.tokens))}", highlight=False)
    if "text" in payload:
        console.print(payload["text"], highlight=False, markup=False)
    rate = payload["decode_tokens_per_s"]
    console.print(f"prefill {payload['prefill_ms']:.1f} ms" + (f", decode {rate:.1f} tokens/s" if rate else ""))


def parse_ids(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AttnresError(f"--ids {text!r}: expected comma-separated whole numbers, e.g. 1,2,3") from None
    if not values:
        raise AttnresError("--ids: the prompt is empty")
    return values


def load_tokenizer(model: Path):
    """The Hugging Face ``tokenizer.json`` in MODEL's folder (or inside a checkpoint folder)."""
    path = (model if model.is_dir() else model.parent) / "tokenizer.json"
    if not path.is_file():
        raise AttnresError(f"--prompt needs a tokenizer: no {path}; pass token ids with --ids instead")
    if path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise AttnresError(f"{path}: over {MAX_TOKENIZER_BYTES >> 20} MB; not a tokenizer file")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:
        raise AttnresError(f"{path}: not a readable tokenizers file ({str(exc).splitlines()[0][:200]})") from exc
