"""What fusion needs from outside the graph layer, passed in by the caller: a way to run an ONNX model and a
way to judge two arrays. The graph layer stays below the runners and the parity metrics (docs/architecture.md);
``attnres_export.parity.fusion_checks.onnxruntime_numerics`` is the implementation every command uses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

Feeds = dict[str, np.ndarray]
Session = Callable[[Feeds], Feeds]
"""One loaded model: feeds in, every graph output out (attnres nodes through their reference)."""


class Agreement(Protocol):
    """The verdict on one array against its reference."""

    ok: bool
    rel_l2: float
    cosine: float


@dataclass(frozen=True)
class Numerics:
    open_session: Callable[[onnx.ModelProto], Session]
    """Load a model (the session lives as long as the returned callable)."""
    agree: Callable[[np.ndarray, np.ndarray, str], Agreement]
    """Compare ``got`` with ``want`` against the bar of the storage dtype named last (``float16``, ...)."""

    def run(self, model: onnx.ModelProto, feeds: Feeds) -> Feeds:
        """The outputs of ``model`` on ``feeds``, in a session of their own."""
        return self.open_session(model)(feeds)
