"""``MIN:OPT:MAX`` ranges of the dynamic dims (batch, sequence, past), as TensorRT optimization profiles want them,
and the shapes a parity check runs inside them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DimRange:
    """A dynamic dim's allowed range and the size to optimise (and trace) for."""

    min: int
    opt: int
    max: int

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"

    def as_list(self) -> list[int]:
        return [self.min, self.opt, self.max]


def check_shapes(ranges: dict[str, DimRange]) -> list[tuple[int, int]]:
    """Two (batch, seq) shapes inside the ranges: the optimum, and the largest batch with the fewest tokens
    (a single token whenever the range allows it)."""
    batch, seq = ranges["batch"], ranges["seq"]
    shapes = [(batch.opt, seq.opt), (batch.max, seq.min)]
    return list(dict.fromkeys(shapes))


def check_shapes_with_past(ranges: dict[str, DimRange]) -> list[tuple[int, int, int]]:
    """(batch, seq, past) shapes of a with-past check (ranges ``batch``, ``seq``, ``past``, ``total``): a prefill
    at the optimum batch with at least 8 new tokens (past 0 when the range allows it, else its minimum), and a
    decode step at the largest batch with the fewest new tokens after a prefill of the optimum past length (at
    least 1)."""
    batch, seq, past = ranges["batch"], ranges["seq"], ranges["past"]
    total_max = ranges["total"].max
    prefill = (batch.opt, min(max(seq.opt, 8), seq.max, total_max - past.min), past.min)
    decode_past = min(max(past.opt, 1, past.min), past.max, total_max - seq.min)
    decode = (batch.max, seq.min, decode_past)
    return list(dict.fromkeys([prefill, decode]))
