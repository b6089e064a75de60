"""Interleaved rounds for benchmarks that compare runs on a shared machine: the order each round runs them in, and
ratios paired within a round (load that moves during a run hits both sides of each ratio alike)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def round_order(count: int, round_: int) -> list[int]:
    """The indices ``0..count-1`` in the order round ``round_`` runs them: rotated by one every two rounds and
    reversed every other round, so that over the rounds each takes every place in a round (first, middle, last)
    alike; with two it alternates, with three six rounds run all six orders."""
    shift = (round_ // 2) % count if count else 0
    order = list(range(shift, count)) + list(range(shift))
    return order[::-1] if round_ % 2 else order


def paired_ratios(runs: Sequence[float], bases: Sequence[float]) -> list[float]:
    """Each round's figure over the base's figure in that same round."""
    return [run / base for run, base in zip(runs, bases, strict=True)]


def paired_median(runs: Sequence[float], bases: Sequence[float]) -> float:
    """The median over the rounds of the paired ratios."""
    return statistics.median(paired_ratios(runs, bases))
