"""Token generation with a KV cache (docs/decode.md) on PyTorch, ONNX Runtime (a with-past ONNX) or TensorRT.

Every backend is a ``backends`` Runner over the with-past graph's inputs and outputs, by name; a ``Decoder``
wraps it with the cache layout read from the graph (or the model's ``cache_inputs()``), so any state a family
carries (grouped K/V, a compressed latent, a recurrent state) goes through unchanged. ``generate`` runs a prefill
over the prompt (past length 0), then one decode step per new token; greedy unless a temperature is given. Logits
that are not all numbers stop it at that step: NaN or infinite logits have no meaningful argmax (greedy would
print token 0 for ever).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from attnres_export.backends.base import Runner
from attnres_export.errors import AttnresError, GenerationError
from attnres_export.graphs.metadata import export_info, input_axes
from attnres_export.models.base import PAST_PREFIX, PRESENT_PREFIX, STEP_INPUTS, WithPastFeeds, step_input_axes

if TYPE_CHECKING:
    from torch import nn


class Decoder:
    """One forward step of a with-past graph behind ``runner``: ``step(ids, mask, positions, past) -> (logits,
    past)``, ``past`` in the order of the graph's cache inputs.
    ``warnings``: lines for the user about what could not be checked (that the graph is the model's)."""

    def __init__(self, runner: Runner, axes: dict[str, list[str | int]], backend: str, info: dict | None = None,
                 past_dtypes: dict[str, type] | None = None) -> None:
        self.past_names = [name for name in axes if name.startswith(PAST_PREFIX)]
        missing = [n for n in STEP_INPUTS if n not in axes]
        if missing or not self.past_names:
            raise AttnresError(f"{runner.artifact or 'the model'}: not a with-past model (no "
                               f"{', '.join(missing) or 'past_key_values'} inputs); export it with "
                               "`attnres-export MODEL --with-past`")
        for name in self.past_names:
            static = [a for a in axes[name] if a not in ("batch", "past")]
            if not all(isinstance(a, int) for a in static):
                raise AttnresError(f"{runner.artifact}: cache input {name} needs static sizes besides batch and past, "
                                   f"got {axes[name]}")
        self.runner, self.backend, self.axes = runner, backend, axes
        self.info = info or {}
        self.max_seq_len: int | None = self.info.get("max_seq_len")
        self.past_dtypes = past_dtypes or {}
        self.warnings: list[str] = []
        runner.activate()

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """The state before the first token: no past positions, zeros elsewhere."""
        return [np.zeros([batch if a == "batch" else 0 if a == "past" else a for a in self.axes[name]],
                         self.past_dtypes.get(name, np.float32)) for name in self.past_names]

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
             past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                 **dict(zip(self.past_names, past, strict=True))}
        out = self.runner.infer(feeds)
        presents = [out[PRESENT_PREFIX + n.removeprefix(PAST_PREFIX)] for n in self.past_names]
        return out["logits"], [p.astype(self.past_dtypes.get(n, p.dtype), copy=False)
                               for n, p in zip(self.past_names, presents, strict=True)]

    def close(self) -> None:
        self.runner.deactivate()


def torch_decoder(model) -> Decoder:
    """The PyTorch model (eager, CPU) through its ``with_past()`` form."""
    from attnres_export.backends.pytorch.runner import TorchRunner

    with_past = model.with_past()
    if with_past is None:
        raise AttnresError(f"generate: {model.config.arch} models have no KV cache and do not generate text")
    cache = with_past.cache_inputs()
    axes = step_input_axes(cache)
    names = ["logits", *(c.present for c in cache)]
    runner = TorchRunner(WithPastFeeds(with_past).eval(), names, artifact=model.config.arch)
    info = {"max_seq_len": model.config.max_seq_len, "vocab_size": model.config.vocab_size}
    return Decoder(runner, axes, "pytorch", info)


def onnx_decoder(path: Path, threads: int | None = None, model: nn.Module | None = None,
                 model_name: str = "the model") -> Decoder:
    """ONNX Runtime CPU on a with-past ONNX (attnres nodes through their NumPy reference ops). With ``model``
    (called ``model_name`` in messages), the graph is refused before ONNX Runtime loads it when it is another
    model's (``decode/identity.py``), and the decoder warns when that cannot be told."""
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
    from attnres_export.decode.identity import refuse_other_model
    from attnres_export.graphs.load import load_onnx

    path = Path(path)
    graph = load_onnx(path, load_external_data=False)
    warning = None if model is None else refuse_other_model(path, graph, model, model_name)
    runner = OnnxRuntimeRunner(path, artifact=path.name, threads=threads)
    dtypes = {v.name: np.float16 if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32
              for v in graph.graph.input if v.name.startswith(PAST_PREFIX)}
    decoder = Decoder(runner, input_axes(graph), runner.backend, export_info(graph), dtypes)
    decoder.warnings += [warning] if warning else []
    return decoder


def engine_decoder(path: Path, plugin: Path | None = None, allow_engine_host_code: bool = False) -> Decoder:
    """A TensorRT engine built from a with-past ONNX (not yet verified on TensorRT: it is not installable here).
    An engine records no model identity, so the decoder warns that its pairing with the model is unchecked."""
    from attnres_export.backends.tensorrt.runner import TensorRTRunner

    runner = TensorRTRunner(path, plugin=plugin, allow_engine_host_code=allow_engine_host_code)
    decoder = Decoder(runner, runner.input_axes(), "tensorrt")
    decoder.warnings.append(f"{Path(path).name}: a TensorRT engine records no model identity, so it cannot be "
                            "checked that it was built from this model's with-past export")
    return decoder


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


def generate(decoder: Decoder, prompt: list[int], max_new_tokens: int, sampling: Sampling | None = None,
             vocab_size: int | None = None) -> Generation:
    """Prefill ``prompt`` then decode ``max_new_tokens`` tokens (batch 1)."""
    sampling = sampling or Sampling()
    if not prompt:
        raise AttnresError("generate: the prompt is empty; pass --ids or --prompt")
    if max_new_tokens < 1:
        raise AttnresError(f"--max-new-tokens {max_new_tokens}: need >= 1")
    if vocab_size is not None and not all(0 <= t < vocab_size for t in prompt):
        raise AttnresError(f"--ids: every token id must be in 0..{vocab_size - 1}")
    if decoder.max_seq_len is not None and len(prompt) + max_new_tokens - 1 > decoder.max_seq_len:
        raise AttnresError(f"prompt ({len(prompt)}) + --max-new-tokens ({max_new_tokens}) exceeds the model's "
                           f"max_seq_len {decoder.max_seq_len}")
    rng = np.random.default_rng(sampling.seed)
    ids = np.array([prompt], dtype=np.int64)
    n = ids.shape[1]
    start = time.perf_counter()
    logits, past = decoder.step(ids, np.ones((1, n), np.int64), np.arange(n, dtype=np.int64)[None],
                                decoder.empty_past(1))
    token = pick(finite(logits, 0, decoder.backend)[:, -1], sampling, rng)
    prefill = time.perf_counter() - start
    tokens = [int(token[0])]
    start = time.perf_counter()
    for pos in range(n, n + max_new_tokens - 1):
        logits, past = decoder.step(token[:, None], np.ones((1, pos + 1), np.int64),
                                    np.array([[pos]], dtype=np.int64), past)
        token = pick(finite(logits, pos - n + 1, decoder.backend)[:, -1], sampling, rng)
        tokens.append(int(token[0]))
    return Generation(tokens, list(prompt), decoder.backend, prefill, time.perf_counter() - start)


def finite(logits: np.ndarray, step: int, backend: str) -> np.ndarray:
    """``logits`` of ``step`` (0: the prefill, N: the Nth decode step) when they are all numbers; else one line
    naming the step: a token picked from NaN or infinite logits means nothing."""
    if not np.isfinite(logits).all():
        what = "step 0 (the prefill)" if step == 0 else f"step {step} (decode of new token {step + 1})"
        raise GenerationError(f"generate: the {backend} logits of {what} are NaN or infinite: the model overflows "
                              "or holds broken weights; check the checkpoint, or run it in float32 if it is 16-bit")
    return logits
