"""Small helpers over ONNX protos shared by the graph transforms."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx
from onnx import helper as oh

from attnres_export.errors import GraphError
from attnres_export.ops.opset import DOMAIN

PROTOBUF_LIMIT = 2**31 - 1
EXTERNAL_DATA_MARGIN = 64 << 20


def needs_external_data(model: onnx.ModelProto) -> bool:
    """Is ``model`` too close to protobuf's 2 GB limit to be serialized in one piece?"""
    return not fits_in_one_file(model.ByteSize())


def fits_in_one_file(size: int) -> bool:
    """Can a model of ``size`` bytes, weights included, be one protobuf file?"""
    return size <= PROTOBUF_LIMIT - EXTERNAL_DATA_MARGIN


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy (transforms never change the caller's model)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


WEIGHT_BYTES = 1 << 16
"""An initializer above this size is a weight: no shape computation reads its values."""


def weightless_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers above ``WEIGHT_BYTES`` are graph inputs of the same type and shape:
    what shape and type inference need, at the cost of the graph rather than of the weights."""
    def as_input(init: onnx.TensorProto, graph: onnx.GraphProto) -> None:
        graph.input.append(oh.make_tensor_value_info(init.name, init.data_type, list(init.dims)))

    return copy_without_weights(model, WEIGHT_BYTES, as_input)


def copy_without_weights(model: onnx.ModelProto, limit: int,
                         replace: Callable[[onnx.TensorProto, onnx.GraphProto], None]) -> onnx.ModelProto:
    """A copy of ``model`` in which ``replace(init, graph)`` stands in for each main-graph initializer over
    ``limit`` bytes; the others are copied. The weights themselves are never copied."""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip={"graph"})
    _copy_fields(model.graph, out.graph, skip={"initializer"})
    for init in model.graph.initializer:
        if init.ByteSize() <= limit or init.data_location == onnx.TensorProto.EXTERNAL:
            out.graph.initializer.add().CopyFrom(init)
        else:
            replace(init, out.graph)
    return out


def _copy_fields(source, target, skip: set[str]) -> None:
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise GraphError("the model imports no default-domain opset; is it a valid ONNX model?")


def set_domain_import(model: onnx.ModelProto, domain: str, version: int | None) -> None:
    """Add, update (``version``) or remove (``None``) one domain of ``opset_import``."""
    kept = [e for e in model.opset_import if e.domain != domain]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    if version is not None:
        model.opset_import.append(onnx.helper.make_opsetid(domain, version))


def attnres_nodes(graph: onnx.GraphProto, domain: str = DOMAIN) -> list[onnx.NodeProto]:
    return [n for n in graph.node if n.domain == domain]


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by ``node``'s attributes: an If's branches, a Loop's or Scan's body."""
    return [g for attr in node.attribute
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs))]


def replace_nodes(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto]) -> None:
    new = list(nodes)
    del graph.node[:]
    graph.node.extend(new)


def metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def set_metadata(model: onnx.ModelProto, key: str, value: str | None) -> None:
    kept = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if value is not None:
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))


def unique_namer(graph: onnx.GraphProto, prefix: str):
    """A function returning fresh value names ``prefix/<n>`` that collide with nothing in ``graph``."""
    used = {v for n in graph.node for v in (*n.input, *n.output)}
    used |= {i.name for i in graph.initializer} | {i.name for i in graph.input}
    counter = iter(range(1 << 30))

    def fresh(hint: str) -> str:
        while True:
            name = f"{prefix}/{hint}_{next(counter)}"
            if name not in used:
                used.add(name)
                return name

    return fresh
