"""The two spellings of ResidualScoreAttention's optional inputs.

ONNX spells an absent optional input as an empty name (``q, k, v, "", mask``). TensorRT's ONNX parser turns an
empty name into a null tensor that it hands to the plugin (onnx-tensorrt ``addPluginWithCreator``), so the
``tensorrt`` and ``ort-trt`` targets write the *compact* spelling instead: only the present inputs, in order,
with the integer attributes ``has_prev_scores`` and ``has_mask`` (plugin fields) saying which they are.
"""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.graphs.onnx_utils import attribute
from attnres_export.ops.identity import DOMAIN, ORT_TRT_DOMAIN, RESIDUAL_ATTENTION

PRESENCE_ATTRIBUTES = ("has_prev_scores", "has_mask")
"""Attribute per optional input (positions 3 and 4), in the compact spelling."""


def is_attention(node: onnx.NodeProto) -> bool:
    return node.op_type == RESIDUAL_ATTENTION and node.domain in (DOMAIN, ORT_TRT_DOMAIN)


def attention_inputs(node: onnx.NodeProto) -> list[str]:
    """``[q, k, v, prev_scores, mask_bias]`` with ``""`` for an absent input, whichever the spelling."""
    names = list(node.input)
    flags = [attribute(node, name) for name in PRESENCE_ATTRIBUTES]
    if all(flag is None for flag in flags):
        return [*names, "", ""][:5]
    present = iter(names[3:])
    return names[:3] + [next(present, "") if flag else "" for flag in flags]


def compact(node: onnx.NodeProto) -> None:
    """Rewrite ``node`` in place to present inputs only, with ``has_prev_scores`` and ``has_mask``."""
    names = attention_inputs(node)
    _set_inputs(node, [name for name in names if name])
    drop_presence(node)
    flags = zip(PRESENCE_ATTRIBUTES, names[3:], strict=True)
    node.attribute.extend(oh.make_attribute(name, int(bool(present))) for name, present in flags)


def expand(node: onnx.NodeProto) -> None:
    """Rewrite ``node`` in place to the ONNX spelling: five positions, empty names for absent inputs."""
    names = attention_inputs(node)
    while names and not names[-1]:
        names.pop()
    _set_inputs(node, names)
    drop_presence(node)


def compact_all(graph: onnx.GraphProto) -> None:
    for node in graph.node:
        if is_attention(node):
            compact(node)


def _set_inputs(node: onnx.NodeProto, names: list[str]) -> None:
    del node.input[:]
    node.input.extend(names)


def drop_presence(node: onnx.NodeProto) -> None:
    """Remove ``has_prev_scores``/``has_mask`` (for consumers that only know the ONNX spelling)."""
    kept = [a for a in node.attribute if a.name not in PRESENCE_ATTRIBUTES]
    del node.attribute[:]
    node.attribute.extend(kept)
