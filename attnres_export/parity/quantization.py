"""How far a quantized model is from the model it was quantized from: information beside a quantized export's
parity check, which judges the graph against the quantized model itself (docs/quantization.md#parity).

Both models run in float64 on the same random tokens at each check shape (a with-past shape ``batch x seq x past``
as ``seq + past`` tokens at once); the table gives the relative L2 distance of the logits and how often their top-1
tokens agree."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from attnres_export.backends.pytorch.runner import TorchRunner


def quantization_distance(quantized: Callable[[], nn.Module], unquantized: Callable[[], nn.Module],
                          shapes: list[tuple[int, ...]], seed: int) -> list[dict]:
    """One row per shape: ``shape``, ``rel_l2`` of the quantized logits from the unquantized ones, ``top1``, the
    fraction of positions whose most likely token agrees. Each model is built, run and released in turn."""
    feeds = []
    for shape in shapes:
        batch, seq = shape[0], shape[1] + (shape[2] if len(shape) > 2 else 0)
        feeds.append((shape, batch, seq))
    logits: list[list[np.ndarray]] = []
    for build in (quantized, unquantized):
        model = build()
        runner = TorchRunner(model, list(model.output_names), dtype="float64")
        logits.append([runner.infer(model.random_inputs(batch, seq, np.random.default_rng(seed)))[
            model.output_names[0]] for _, batch, seq in feeds])
        del runner, model
    rows = []
    for (shape, _, _), ours, theirs in zip(feeds, *logits, strict=True):
        rel = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-300))
        top1 = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
        rows.append({"shape": "x".join(map(str, shape)), "rel_l2": rel, "top1": top1})
    return rows
