"""Two-phase Block AttnRes: a phase-1 aggregation merged with the block's partial sum (docs/fusion.md).

Phase 1 mixes the completed blocks (a matched site: sources and result ``o``); phase 2 merges the one
intra-block source ``p`` by an online-softmax step, through a log-sum-exp and ``exp``/``sigmoid``, or through a
running max and sum. A phase 1 kept unnormalized (``sum(exp(x) * v)`` and ``sum(exp(x))`` apart) is normalized
here, from the captured values, before the segment test. Whatever ops spell it, the merged result ``h`` is one
aggregation over ``[blocks..., p]`` and lies on the segment from ``o`` to ``p`` in every row
(``h = o + g * (p - o)``, ``0 <= g <= 1``). That is the cheap anchor: the tensors after ``o`` are the candidate
results, the source-shaped tensors behind each the candidate partials (of those on the segment, the one whose merge
is computed from the fewest nodes: not a copy of ``p`` made after it), and the captured values pick the pair.
Whether the pair is AttnRes is decided as for every site (probe.py, verify.py). An unnormalized phase 1 that is not
merged is taken up to the tensor equal to its normalized result (``acc / l``, however spelled).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from attnres_export.graphs.fusion.depth.match import SiteMatch, query_axes
from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.region import extract_region
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
    after = _tensors_after(index, match.output)
    for mixed in _phase1_results(match, values):
        for result in after:
            value = values.get(result)
            if value is None or value.shape != mixed.shape or value.dtype != mixed.dtype:
                continue
            partials = [p for p in _partials_behind(index, result, {*match.sources, match.output}, set(after),
                                                    values, mixed) if _on_segment(mixed, values[p], value)]
            sizes = {p: _region_size(index, [*match.sources, p], result) for p in partials}
            closed = [p for p in partials if sizes[p] is not None]
            if closed:
                partial = min(closed, key=lambda p: sizes[p])
                return SiteMatch(match.softmax, [*match.sources, partial], result, match.constants, query=match.query)
    return None


def normalized_site(index: GraphIndex, match: SiteMatch, values: dict[str, np.ndarray]) -> SiteMatch | None:
    """A phase 1 kept unnormalized and not merged, up to the tensor after it that is its normalized result (the
    division by its sum of exponentials, however spelled: ``acc[s] / l[s]`` for one query of a batched phase 1)."""
    after = _tensors_after(index, match.output)
    for mixed in _phase1_results(match, values):
        for result in after:
            value = values.get(result)
            if value is not None and value.shape == mixed.shape and value.dtype == mixed.dtype and \
                    np.linalg.norm(np.asarray(value, np.float64) - mixed) <= MOVED_TOLERANCE * np.linalg.norm(mixed):
                return SiteMatch(match.softmax, match.sources, result, match.constants, query=match.query)
    return None


def _phase1_results(match: SiteMatch, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The phase-1 result, normalized from the captured values: as it is, or divided by its sum of exponentials (one
    query's sums, for a batched phase 1: each axis that can hold them is tried)."""
    mixed = values.get(match.output)
    if mixed is None or match.normalizer is None:
        return [] if mixed is None else [mixed]
    total = values.get(match.normalizer)
    if total is None:
        return []
    rows = mixed.size // mixed.shape[-1]
    sums = [total] if match.query is None else \
        [np.take(total, match.query, axis=a) for a in query_axes(total.shape, match.query, rows)]
    return [(np.asarray(mixed, np.float64) / np.asarray(s, np.float64).reshape(*mixed.shape[:-1], 1)).astype(
        mixed.dtype) for s in sums if s.size == rows]


def _region_size(index: GraphIndex, sources: list[str], result: str) -> int | None:
    """How many nodes compute ``result`` from ``sources`` and constants (None: it depends on more). Of two partials
    on the segment the one with the smaller region is the partial itself: a copy of it computed later (a one-key
    softmax over ``p`` gives ``1 * p``) leaves the merge computing ``p``'s own score from the nodes before it."""
    try:
        return len(extract_region(index, sources, result).nodes)
    except Rejected:
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
