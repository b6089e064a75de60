"""The assembled graph as a ModelProto, each copy of a traced node serialized by copying the proto of its kind's
first copy (docs/exporter-notes.md#weights-io).

onnx_ir's serializer builds every node's and value's proto field by field in Python, about 25 µs each: 0.1 s for
the 3,759 nodes and 4,311 values of a 48-layer d512 model, a cost that grows with depth. The copies of one traced
node differ only in their names (node, inputs, outputs: ``exporter/assemble.py`` binds the same attributes, types
and shapes), so a copy's NodeProto and the ValueInfoProtos of its outputs are the first copy's, copied in C and
renamed. Everything else is serialized by onnx_ir itself, in the order ``onnx_ir.serde.serialize_graph_into``
writes it, so the result is the same bytes (``tests/exporter/test_graph_proto.py``)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
from onnx_ir import serde

COPY_OF = "attnres.copy_of"
"""``Node.meta`` key: the traced node a node of the assembled graph copies (only where the copy shares that node's
attributes: not a node with subgraphs, whose copies hold their own)."""


def serialize_assembled(model: ir.Model) -> onnx.ModelProto:
    """``model`` as onnx_ir would serialize it, its marked copies from their first copy's protos."""
    graph = model.graph
    if (model.functions or model.metadata_props or graph.metadata_props or model.doc_string or graph.doc_string
            or model.domain or model.model_version):
        return serde.serialize_model(model)
    proto = onnx.ModelProto(ir_version=model.ir_version)
    if model.producer_name:
        proto.producer_name = model.producer_name
    if model.producer_version:
        proto.producer_version = model.producer_version
    for domain, version in sorted(model.opset_imports.items()):
        proto.opset_import.add(domain=domain, version=version)
    out = proto.graph
    if graph.name:
        out.name = graph.name
    for value in graph.inputs:
        serde.serialize_value_into(out.input.add(), value)
    inputs = {value.name for value in graph.inputs}
    for value in graph.initializers.values():
        if _described(value) and value.name not in inputs:
            serde.serialize_value_into(out.value_info.add(), value)
        value.const_value.name = value.name
        serde.serialize_tensor_into(out.initializer.add(), from_=value.const_value)
    firsts: dict[ir.Node, tuple[onnx.NodeProto, list[onnx.ValueInfoProto | None]]] = {}
    for node in graph:
        traced = node.meta.get(COPY_OF)
        if traced in firsts:
            _copy_into(out, node, *firsts[traced])
            continue
        node_proto = out.node.add()
        serde.serialize_node_into(node_proto, from_=node, model_ir_version=model.ir_version)
        infos: list[onnx.ValueInfoProto | None] = []
        for output in node.outputs:
            if output.is_graph_output() or not _described(output):
                infos.append(None)
                continue
            info = out.value_info.add()
            serde.serialize_value_into(info, output)
            infos.append(info)
        if traced is not None:
            firsts[traced] = (node_proto, infos)
    for value in graph.outputs:
        serde.serialize_value_into(out.output.add(), from_=value)
    return proto


def _copy_into(out: onnx.GraphProto, node: ir.Node, first: onnx.NodeProto,
               infos: list[onnx.ValueInfoProto | None]) -> None:
    node_proto = out.node.add()
    node_proto.CopyFrom(first)
    if node.name:
        node_proto.name = node.name
    else:
        node_proto.ClearField("name")
    del node_proto.input[:]
    node_proto.input.extend(value.name if value is not None else "" for value in node.inputs)
    del node_proto.output[:]
    node_proto.output.extend(value.name for value in node.outputs)
    for output, info in zip(node.outputs, infos, strict=True):
        if output.is_graph_output() or not _described(output):
            continue
        if info is None:  # the first copy's output was a graph output; this one is not
            serde.serialize_value_into(out.value_info.add(), output)
            continue
        copy = out.value_info.add()
        copy.CopyFrom(info)
        copy.name = output.name


def _described(value: ir.Value) -> bool:
    """Does onnx_ir write a ValueInfoProto for ``value`` (``serde._should_create_value_info_for_value``)?"""
    return bool(value.name) and (value.shape is not None or value.type is not None or bool(value.metadata_props)
                                 or bool(value.doc_string))
