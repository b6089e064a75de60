"""``MIN:OPT:MAX`` ranges of the dynamic dims (batch, sequence), as TensorRT optimization profiles want them."""

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
