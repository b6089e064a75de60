"""The expert choices of every router in a forward pass, recorded or forced (docs/parity.md#routing-aware-comparison).

Every MoE router of every family picks its experts with ``top_k_experts``: a plain ``torch.topk`` (an ONNX ``TopK``
in an export), unless a ``traced_routing`` context is active, which records each call's scores and choice and can
make each call take given experts instead. A parity check reads an artifact's own choices and reruns the float64
model with them, so that a 16-bit artifact that breaks a near-tie between two experts the other way is judged on
the arithmetic it does, not on a discrete choice float64 makes differently.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from attnres_export.errors import ParityError


class RoutingTrace:
    """Every router call of a forward pass, in call order: the scores it chose by, the same scores before any
    correction bias (``unbiased``: what a flip's regret is measured against, docs/parity.md#routing-aware-comparison)
    and the experts it chose.

    With ``forced`` (one ``[tokens, k]`` index tensor per call, e.g. an exported graph's own choices), each call
    takes the given experts instead of its top-k and weights them by its own scores: the float64 reference rerun
    with an artifact's routing (docs/parity.md#routing-aware-comparison)."""

    def __init__(self, forced: Sequence[torch.Tensor] | None = None) -> None:
        self.forced = list(forced) if forced is not None else None
        self.scores: list[torch.Tensor] = []
        self.unbiased: list[torch.Tensor] = []
        self.chosen: list[torch.Tensor] = []

    def top_k(self, choice: torch.Tensor, k: int, unbiased: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.forced is None:
            values, indices = torch.topk(choice, k, dim=-1)
        else:
            if len(self.chosen) >= len(self.forced):
                raise ParityError(f"the model routed more than the {len(self.forced)} times it was given choices for")
            indices = self.forced[len(self.chosen)].to(device=choice.device, dtype=torch.int64)
            if indices.shape != (choice.shape[0], k):
                raise ParityError(f"router call {len(self.chosen)} chooses [{choice.shape[0]}, {k}] experts; the "
                                  f"forced choice is {list(indices.shape)}")
            values = choice.gather(1, indices)
        self.scores.append(choice.detach())
        self.unbiased.append((choice if unbiased is None else unbiased).detach())
        self.chosen.append(indices.detach())
        return values, indices


_TRACE: ContextVar[RoutingTrace | None] = ContextVar("routing_trace", default=None)


@contextmanager
def traced_routing(forced: Sequence[torch.Tensor] | None = None) -> Iterator[RoutingTrace]:
    """Inside, every router records its calls in the yielded trace (and takes ``forced`` choices when given)."""
    trace = RoutingTrace(forced)
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


def top_k_experts(choice: torch.Tensor, k: int, unbiased: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(choice, k)`` along the experts (an ONNX ``TopK``), or what an active ``traced_routing`` says.
    ``unbiased``: the scores before a correction bias was added to ``choice`` (None: ``choice`` has none); only a
    trace reads it."""
    trace = _TRACE.get()
    return torch.topk(choice, k, dim=-1) if trace is None else trace.top_k(choice, k, unbiased)
