"""Attention written with einsums in another layout than ResidualScoreAttention's ``[B, H, T, d]``: e.g. a vision
transformer's ``bqhd,bkhd->bqkh`` scores ``[B, T, T, H]`` with the softmax over axis 2, and ``bqkh,bkhd->bqhd``.

The letters of the ``Q K^T`` einsum say which axis is which: the one summed over is the head dim, the one of ``q``
alone the query, the one of ``k`` alone the key, the two in all three terms batch and heads (in the order the
scores have them: attention is the same per pair of them either way). The ``P V`` einsum must read the scores'
axes in those roles (``P`` has the scores' layout). The fused node then reads Transposes of ``q, k, v``, the previous
scores and the mask, and its outputs are transposed back to the graph's layouts (rewrite.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from attnres_export.ops.onnx_nodes import attribute

MATMUL_PV = "abqk,abkd->abqd"
"""A 4-D ``P @ V`` MatMul as an einsum."""


@dataclass(frozen=True)
class Layout:
    """Transpose permutations between the graph's tensors and the node's."""

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    scores: tuple[int, ...]
    """Takes the graph's scores (and the previous scores and the mask, which share their layout) to the node's."""
    out: tuple[int, ...]
    """Takes the node's attention output to the graph's."""

    @property
    def key_axis(self) -> int:
        """The axis of the graph's scores that the softmax must run over."""
        return self.scores[3]

    @property
    def scores_back(self) -> tuple[int, ...]:
        """Takes the node's scores to the graph's layout."""
        return tuple(self.scores.index(axis) for axis in range(4))

    @property
    def inputs(self) -> tuple[tuple[int, ...], ...]:
        """The permutation of each node input in order: ``q, k, v, prev_scores, mask_bias``."""
        return self.q, self.k, self.v, self.scores, self.scores

    @property
    def identity(self) -> bool:
        return all(perm == (0, 1, 2, 3) for perm in (*self.inputs, self.out))


def _terms(equation: str) -> tuple[str, str, str] | None:
    """The two input terms and the output term of a two-operand einsum over 4-D tensors, each axis named once."""
    inputs, arrow, output = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    if not arrow or len(terms) != 2 or any(len(t) != 4 or len(set(t)) != 4 for t in (*terms, output)):
        return None
    return terms[0], terms[1], output


def _equation(node: onnx.NodeProto) -> str:
    return (attribute(node, "equation") or b"").decode()


def query_key_roles(node: onnx.NodeProto) -> tuple[str, str, str, str, str] | None:
    """``(batch, heads, query, key, dim)``, the letters of a ``Q K^T`` einsum (batch and heads in the scores'
    order), or None when the einsum is no ``Q K^T``."""
    terms = _terms(_equation(node))
    if terms is None:
        return None
    q, k, scores = terms
    dim = [c for c in q if c in k and c not in scores]
    query = [c for c in q if c in scores and c not in k]
    key = [c for c in k if c in scores and c not in q]
    pair = [c for c in scores if c in q and c in k]
    if len(dim) != 1 or len(query) != 1 or len(key) != 1 or len(pair) != 2:
        return None
    return pair[0], pair[1], query[0], key[0], dim[0]


def einsum_layout(query_key: onnx.NodeProto, weighted: onnx.NodeProto) -> Layout | None:
    """The layout of an attention whose ``Q K^T`` is the einsum ``query_key`` and whose ``P V`` is ``weighted`` (an
    einsum, or a 4-D MatMul), or None when the two do not make attention."""
    roles = query_key_roles(query_key)
    terms = _terms(_equation(weighted) if weighted.op_type == "Einsum" else MATMUL_PV)
    if roles is None or terms is None:
        return None
    batch, heads, query, key, dim = roles
    q, k, scores = _terms(_equation(query_key))
    p, v, out = terms
    at = {letter: p[scores.index(letter)] for letter in (batch, heads, query, key)}
    value_dim = [c for c in v if c not in p]
    if len(value_dim) != 1 or at[key] in out or at[key] not in v or at[query] in v or \
            set(out) != {at[batch], at[heads], at[query], value_dim[0]} or not {at[batch], at[heads]} <= set(v):
        return None
    node_out = (at[batch], at[heads], at[query], value_dim[0])
    return Layout(q=_perm(q, (batch, heads, query, dim)), k=_perm(k, (batch, heads, key, dim)),
                  v=_perm(v, (at[batch], at[heads], at[key], value_dim[0])),
                  scores=_perm(scores, (batch, heads, query, key)), out=_perm(node_out, tuple(out)))


def _perm(term: str | tuple[str, ...], order: tuple[str, ...]) -> tuple[int, ...]:
    """The Transpose permutation taking a tensor whose axes are ``term`` to axes ``order``."""
    return tuple(term.index(letter) for letter in order)
