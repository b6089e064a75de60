"""Two-phase Block AttnRes: a phase-1 aggregation merged with the block's partial sum (docs/fusion.md).

Phase 1 mixes the completed blocks (a matched site: sources and result ``o``); phase 2 merges the one
intra-block source ``p`` by an online-softmax step, through a log-sum-exp and ``exp``/``sigmoid``, or through a
running max and sum. A phase 1 kept unnormalized (``sum(exp(x) * v)`` and ``sum(exp(x))`` apart) is normalized
here, from the captured values, before the segment test. Whatever ops spell it, the merged result ``h`` is one
aggregation over ``[blocks..., p]`` and lies on the segment from ``o`` to ``p`` in every row
(``h = o + g * (p - o)``, ``0 <= g <= 1``). That is
the cheap anchor: the tensors after ``o`` are the candidate results, the source-shaped tensors behind each the
candidate partials, and the captured values pick the pair. Whether the pair is AttnRes is decided as for every
site (probe.py, verify.py).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from attnres_export.graphs.fusion.depth.match import SiteMatch
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.resolve import strip_casts

RESULT_WINDOW = 48
"""How many nodes computed from the phase-1 result are looked at for the merge (the merge itself is about 15)."""
PARTIAL_STEPS = 64
"""How many nodes the walk back from a candidate result looks through for the partial."""
SEGMENT_TOLERANCE = 1e-3
"""Relative distance from the segment ``o``..``p`` within which a tensor counts as on it (float32 rounding)."""
MOVED_TOLERANCE = 1e-5
"""How far (relative) a merged result must be from ``o``: nearer, it is ``o`` itself, or a copy of it."""


def merged_site(index: GraphIndex, match: SiteMatch, values: dict[str, np.ndarray]) -> SiteMatch | None:
    """``match`` extended by the partial source it is merged with, or None when its result is not merged."""
    mixed = values.get(match.output)
    if mixed is None:
        return None
    if match.normalizer is not None:
        total = values.get(match.normalizer)
        if total is None or total.size * mixed.shape[-1] != mixed.size:
            return None
        mixed = (np.asarray(mixed, np.float64) / np.asarray(total, np.float64).reshape(*mixed.shape[:-1], 1))
        mixed = mixed.astype(values[match.output].dtype)
    after = _tensors_after(index, match.output)
    for result in after:
        value = values.get(result)
        if value is None or value.shape != mixed.shape or value.dtype != mixed.dtype:
            continue
        for partial in _partials_behind(index, result, {*match.sources, match.output}, set(after), values, mixed):
            if _on_segment(mixed, values[partial], value):
                return SiteMatch(match.softmax, [*match.sources, partial], result, match.constants)
    return None


def _tensors_after(index: GraphIndex, name: str) -> list[str]:
    """Tensors computed from ``name`` by the first RESULT_WINDOW nodes reached along its consumers (breadth first),
    in graph order: the merge follows ``o`` in data, however far in the graph (a phase 1 run for every query of a
    block before its sublayers is merged only after the sublayers before it)."""
    reached, frontier = {}, [name]
    while frontier and len(reached) < RESULT_WINDOW:
        onward = []
        for tensor in frontier:
            for node in index.consumers.get(tensor, []):
                if id(node) not in reached and len(reached) < RESULT_WINDOW:
                    reached[id(node)] = node
                    onward.extend(o for o in node.output if o)
        frontier = onward
    nodes = sorted(reached.values(), key=lambda node: index.position[id(node)])
    return [o for node in nodes for o in node.output if o]


def _partials_behind(index: GraphIndex, result: str, stop: set[str], derived: set[str],
                     values: dict[str, np.ndarray], like: np.ndarray) -> list[str]:
    """Tensors of ``like``'s shape and type that ``result`` is computed from (nearest first, before widening
    casts), not walking past ``stop`` (the phase-1 sources and result) and not ``derived`` from the phase-1
    result."""
    excluded = stop | derived
    found, seen, pending, steps = [], set(stop), deque([result]), 0
    while pending and steps < PARTIAL_STEPS:
        node = index.producer.get(pending.popleft())
        if node is None:
            continue
        steps += 1
        for name in node.input:
            if not name or name in seen or name in index.initializers:
                continue
            seen.add(name)
            pending.append(name)
            source = strip_casts(index, name, values)
            value = values.get(source)
            if value is not None and value.shape == like.shape and value.dtype == like.dtype \
                    and source not in excluded and source not in found:
                found.append(source)
    return found


def _on_segment(start: np.ndarray, end: np.ndarray, point: np.ndarray) -> bool:
    """Is ``point`` row by row ``start + g * (end - start)`` with one ``0 <= g <= 1`` per row, and not ``start``?"""
    d = np.asarray(point, np.float64).reshape(-1, point.shape[-1]) - start.reshape(-1, start.shape[-1])
    e = np.asarray(end, np.float64).reshape(-1, end.shape[-1]) - start.reshape(-1, start.shape[-1])
    gate = (d * e).sum(-1) / np.maximum((e * e).sum(-1), 1e-30)
    off = np.linalg.norm(d - gate[:, None] * e)
    moved = np.linalg.norm(d)
    return bool(moved > MOVED_TOLERANCE * np.linalg.norm(start) and off <= SEGMENT_TOLERANCE * moved
                and np.all((gate >= -SEGMENT_TOLERANCE) & (gate <= 1 + SEGMENT_TOLERANCE)))
