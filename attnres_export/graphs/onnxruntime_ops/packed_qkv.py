"""A ``GroupQueryAttention`` fed its query, key and value as one projection (docs/onnxruntime-target.md#attention).

Where one node computes a layer's query, key and value projections (``exporter/sibling_matmul_nbits.py`` stacks
their ``MatMulNBits``) and a ``Split`` on the last axis only separates them for the attention, the op reads the
projection itself: ``GroupQueryAttention(qkv, "", "", ...)`` takes ``[batch, seq, (heads + 2 kv_heads) * head]``
(query, then key, then value), as onnxruntime-genai's model builder feeds it, and the ``Split``'s copy goes.
"""

from __future__ import annotations

import onnx

from attnres_export.graphs.onnxruntime_ops.nodes import MS_DOMAIN, Nodes, attr, constant_value, drop_dead_nodes


def packed_qkv(model: onnx.ModelProto) -> int:
    """Feed each ``GroupQueryAttention`` whose query, key and value are, in order, the outputs of one last-axis
    ``Split`` read by nothing else the split's input instead; returns how many were."""
    graph = model.graph
    nodes = Nodes(graph)
    packed = 0
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or node.domain != MS_DOMAIN or len(node.input) < 3:
            continue
        split = nodes.producer(node.input[0])
        if (split is None or split.op_type != "Split" or split.domain not in ("", "ai.onnx")
                or list(split.output) != list(node.input[:3]) or not _last_axis(graph, nodes, split)
                or any(nodes.consumers.get(out, []) != [node] for out in split.output)):
            continue
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        packed += 1
    if packed:
        drop_dead_nodes(graph)
    return packed


def _last_axis(graph: onnx.GraphProto, nodes: Nodes, split: onnx.NodeProto) -> bool:
    """Is ``split`` on the last axis of a 3-D ``[batch, seq, width]`` value, with its sizes given as a constant?"""
    axis = attr(split, "axis", 0)
    return (axis in (-1, 2) and len(split.input) > 1 and split.input[1] != ""
            and constant_value(graph, nodes, split.input[1]) is not None)
