"""Token generation with a KV cache (docs/decode.md) on PyTorch, ONNX Runtime (a with-past ONNX) or TensorRT.

Every backend is one ``Stepper``: ``step(input_ids, attention_mask, position_ids, past) -> (logits, presents)`` on
NumPy arrays, in the with-past graph's layout. ``generate`` runs a prefill over the prompt (past length 0), then
one decode step per new token; greedy unless a temperature is given.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from attnres_export.errors import AttnresError
from attnres_export.graphs.metadata import export_info, input_axes
from attnres_export.models.attnres_lm import AttnResLM, AttnResLMWithPast

PAST_PREFIX = "past_key_values."


class Stepper:
    """One forward step of a with-past model; ``n_layers`` attention layers of ``n_heads x head_dim``."""

    backend: str
    n_layers: int
    n_heads: int
    head_dim: int
    max_seq_len: int | None = None
    past_dtype: type = np.float32

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
             past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        raise NotImplementedError

    def empty_past(self, batch: int) -> list[np.ndarray]:
        return [np.zeros((batch, self.n_heads, 0, self.head_dim), self.past_dtype) for _ in range(2 * self.n_layers)]

    def close(self) -> None:
        """Release sessions or engines."""


class TorchStepper(Stepper):
    """The PyTorch model (eager, CPU) through ``AttnResLM.forward_with_past``."""

    def __init__(self, model: AttnResLM) -> None:
        if not isinstance(model, AttnResLM):
            raise AttnresError(f"generate: only attnres-lm models generate text, this is {type(model).__name__}")
        self.backend = "pytorch"
        self.model = AttnResLMWithPast(model).eval()
        cfg = model.config
        self.n_layers, self.n_heads, self.head_dim, self.max_seq_len = (cfg.n_layers, cfg.n_heads, cfg.head_dim,
                                                                        cfg.max_seq_len)

    def step(self, input_ids, attention_mask, position_ids, past):
        with torch.inference_mode():
            out = self.model(torch.from_numpy(input_ids), torch.from_numpy(attention_mask),
                             torch.from_numpy(position_ids), [torch.from_numpy(p) for p in past])
        return out[0].numpy(), [t.numpy() for t in out[1:]]


class RunnerStepper(Stepper):
    """A with-past ONNX on ONNX Runtime, or its TensorRT engine, behind a backends Runner (feeds by name)."""

    def __init__(self, runner, axes: dict[str, list[str | int]], backend: str, info: dict | None = None,
                 past_dtype: type = np.float32) -> None:
        pasts = sorted((n for n in axes if n.startswith(PAST_PREFIX)), key=_past_order)
        missing = [n for n in ("input_ids", "attention_mask", "position_ids") if n not in axes]
        if missing or not pasts:
            raise AttnresError(f"{runner.artifact}: not a with-past model (no {', '.join(missing) or 'past_key_values'}"
                               " inputs); export it with `attnres-export MODEL --with-past`")
        self.runner, self.backend, self.past_names = runner, backend, pasts
        self.n_layers = len(pasts) // 2
        dims = axes[pasts[0]]
        if not (isinstance(dims[1], int) and isinstance(dims[3], int)):
            raise AttnresError(f"{runner.artifact}: past inputs need static head axes, got {dims}")
        self.n_heads, self.head_dim = dims[1], dims[3]
        self.info = info or {}
        self.max_seq_len = self.info.get("max_seq_len")
        self.past_dtype = past_dtype
        runner.activate()

    def step(self, input_ids, attention_mask, position_ids, past):
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                 **dict(zip(self.past_names, past, strict=True))}
        out = self.runner.infer(feeds)
        presents = [out[n.replace(PAST_PREFIX, "present.")] for n in self.past_names]
        return out["logits"], presents

    def close(self) -> None:
        self.runner.deactivate()


def _past_order(name: str) -> tuple[int, int]:
    _, layer, kind = name.rsplit(".", 2)
    return int(layer) if layer.isdigit() else 0, 0 if kind == "key" else 1


def onnx_stepper(path: Path, threads: int | None = None) -> RunnerStepper:
    """ONNX Runtime CPU on a with-past ONNX (attnres nodes through their NumPy reference ops)."""
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
    from attnres_export.graphs.load import load_onnx

    model = load_onnx(path)
    runner = OnnxRuntimeRunner(model, artifact=path.name, threads=threads)
    elem = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    past = next((n for n in elem if n.startswith(PAST_PREFIX)), None)
    dtype = np.float16 if past and elem[past] == onnx.TensorProto.FLOAT16 else np.float32
    return RunnerStepper(runner, input_axes(model), runner.backend, export_info(model), dtype)


def engine_stepper(path: Path, plugin: Path | None = None, allow_engine_host_code: bool = False) -> RunnerStepper:
    """A TensorRT engine built from a with-past ONNX (not yet verified on TensorRT: it is not installable here)."""
    from attnres_export.backends.tensorrt.runner import TensorRTRunner

    runner = TensorRTRunner(path, plugin=plugin, allow_engine_host_code=allow_engine_host_code)
    return RunnerStepper(runner, runner.input_axes(), "tensorrt")


@dataclass
class Sampling:
    """Greedy when ``temperature`` is 0; else softmax(logits / temperature) over the ``top_k`` best (0 = all)."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise AttnresError(f"--temperature {self.temperature}: need a finite number >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise AttnresError(f"--top-k {self.top_k}: need >= 0 (0 = no cut)")


@dataclass
class Generation:
    tokens: list[int]
    prompt: list[int]
    backend: str
    prefill_s: float
    decode_s: float

    def to_dict(self) -> dict:
        new = len(self.tokens)
        return {"tokens": self.tokens, "prompt": self.prompt, "backend": self.backend,
                "prefill_ms": round(self.prefill_s * 1e3, 3),
                "decode_tokens_per_s": round((new - 1) / self.decode_s, 3) if new > 1 and self.decode_s > 0 else None}


def pick(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> np.ndarray:
    """Next token per row of ``logits [B, V]``."""
    if sampling.temperature == 0:
        return logits.argmax(axis=-1).astype(np.int64)
    scaled = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scaled.shape[-1]:
        cut = np.sort(scaled, axis=-1)[:, -sampling.top_k][:, None]
        scaled = np.where(scaled < cut, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(probs.shape[-1], p=row) for row in probs], dtype=np.int64)


def generate(stepper: Stepper, prompt: list[int], max_new_tokens: int, sampling: Sampling | None = None,
             vocab_size: int | None = None) -> Generation:
    """Prefill ``prompt`` then decode ``max_new_tokens`` tokens (batch 1)."""
    sampling = sampling or Sampling()
    if not prompt:
        raise AttnresError("generate: the prompt is empty; pass --ids or --prompt")
    if max_new_tokens < 1:
        raise AttnresError(f"--max-new-tokens {max_new_tokens}: need >= 1")
    if vocab_size is not None and not all(0 <= t < vocab_size for t in prompt):
        raise AttnresError(f"--ids: every token id must be in 0..{vocab_size - 1}")
    if stepper.max_seq_len is not None and len(prompt) + max_new_tokens - 1 > stepper.max_seq_len:
        raise AttnresError(f"prompt ({len(prompt)}) + --max-new-tokens ({max_new_tokens}) exceeds the model's "
                           f"max_seq_len {stepper.max_seq_len}")
    rng = np.random.default_rng(sampling.seed)
    ids = np.array([prompt], dtype=np.int64)
    n = ids.shape[1]
    start = time.perf_counter()
    logits, past = stepper.step(ids, np.ones((1, n), np.int64), np.arange(n, dtype=np.int64)[None],
                                stepper.empty_past(1))
    token = pick(logits[:, -1], sampling, rng)
    prefill = time.perf_counter() - start
    tokens = [int(token[0])]
    start = time.perf_counter()
    for pos in range(n, n + max_new_tokens - 1):
        logits, past = stepper.step(token[:, None], np.ones((1, pos + 1), np.int64),
                                    np.array([[pos]], dtype=np.int64), past)
        token = pick(logits[:, -1], sampling, rng)
        tokens.append(int(token[0]))
    return Generation(tokens, list(prompt), stepper.backend, prefill, time.perf_counter() - start)
