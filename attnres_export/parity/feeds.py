"""What the PyTorch side of a parity check runs for an attnres checkpoint's model: the feeds of each shape and the
reference runners (float32, and float64 where the bar scales with PyTorch's own error, docs/parity.md#pass-bars:
float32's, and a 16-bit artifact's type's).

The plain graph is fed random token ids; a with-past graph (docs/decode.md) is fed a past that a float32 PyTorch
prefill computed, stored in the artifact's dtype as its runtime takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attnres_export.backends.base import Runner
from attnres_export.backends.pytorch.runner import TorchRunner, read_as
from attnres_export.errors import ParityError
from attnres_export.models.base import (
    WithPastFeeds,
    WithPastModel,
    empty_past,
    step_input_axes,
    step_output_names,
)

FeedMaker = Callable[[tuple[int, ...]], dict[str, np.ndarray]]


@dataclass
class Subject:
    """A checkpoint's model as a parity check runs it."""

    feeds: FeedMaker
    """The inputs at a (batch, seq) or (batch, seq, past) shape; the same seed and shape give the same feeds."""
    reference: Runner
    """The float32 PyTorch model."""
    precise: Runner | None
    """The float64 PyTorch model (None: the check compares with float32 PyTorch at the fixed bar)."""
    in_type: Callable[[str], Runner] | None
    """The PyTorch model computing in a 16-bit type, whose own error scales a 16-bit artifact's bar (None: no
    float64 reference, so no scaled bar)."""
    input_names: list[str]
    output_names: list[str]


def checkpoint_subject(model: nn.Module, with_past: bool, dtype: str, seed: int) -> Subject:
    """The subject of a check of ``model``'s plain graph, or (``with_past``) of its KV-cache graph exported in
    ``dtype`` (the past is fed in that dtype, so the reference sees the same rounded past)."""
    if with_past:
        wrapper = model.with_past()
        if wrapper is None:
            raise ParityError(f"{model.config.arch} models have no KV cache, so they have no with-past graph to check")
        cache = wrapper.cache_inputs()
        names = step_output_names(cache)
        return Subject(past_feed_maker(wrapper, dtype, seed), TorchRunner(WithPastFeeds(wrapper), names), None,
                       None, list(step_input_axes(cache)), names)

    def feeds(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        return model.random_inputs(shape[0], shape[1], np.random.default_rng([seed, *shape]))

    names = list(model.output_names)
    return Subject(feeds, TorchRunner(model, names), TorchRunner(model, names, dtype="float64"),
                   lambda half: TorchRunner(model, names, dtype=half), list(model.input_axes), names)


def has_past(model: nn.Module) -> bool:
    """Whether ``model`` has a with-past graph to check (models/base.py: ``with_past()``)."""
    return model.with_past() is not None


def past_feed_maker(reference: WithPastModel, dtype: str, seed: int) -> FeedMaker:
    """Feeds for a (batch, seq, past) shape: the past comes from a float32 PyTorch prefill of ``past`` random
    tokens (then stored in ``dtype`` as ONNX Runtime takes it), the new tokens follow it at positions
    ``past .. past + seq - 1``."""
    cfg = reference.config

    def feeds(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        b, t, p = shape
        rng = np.random.default_rng([seed, *shape])
        ids = rng.integers(0, cfg.vocab_size, size=(b, p + t), dtype=np.int64)
        cache = reference.cache_inputs()
        past = empty_past(cache, b)
        if p:
            with torch.inference_mode(), read_as(reference, torch.float32):
                out = reference(torch.from_numpy(ids[:, :p]), torch.ones(b, p, dtype=torch.int64),
                                torch.arange(p)[None].expand(b, p), past)
            past = list(out[1:])
        named = {c.name: past_array(tensor, dtype if c.dtype == "model" else c.dtype)
                 for c, tensor in zip(cache, past, strict=True)}
        return {"input_ids": ids[:, p:], "attention_mask": np.ones((b, p + t), np.int64),
                "position_ids": np.broadcast_to(np.arange(p, p + t, dtype=np.int64), (b, t)).copy(), **named}

    return feeds


def past_array(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    """A cache tensor as ONNX Runtime takes it for a ``dtype`` model: float16 as float16, bfloat16 rounded to
    bfloat16 and held in float32 (the CPU check runs bfloat16 models through a float32 emulation)."""
    if dtype == "float16":
        return tensor.to(torch.float16).numpy()
    if dtype == "bfloat16":
        return tensor.to(torch.bfloat16).float().numpy()
    return tensor.float().numpy()
