"""Targets of an exported model (docs/op-set.md#targets): ``tensorrt``, ``portable``, ``ort-trt`` and
``onnxruntime``, and conversions between them."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import helper as oh

from attnres_export.errors import GraphError
from attnres_export.graphs.onnx_utils import (
    attnres_nodes,
    copy_model,
    default_opset,
    metadata,
    replace_nodes,
    set_domain_import,
    set_metadata,
    unique_namer,
)
from attnres_export.graphs.onnxruntime_ops import (
    ONNX_RUNTIME_OPS_KEY,
    OnnxRuntimeOps,
    to_onnxruntime,
)
from attnres_export.graphs.target_names import TARGETS
from attnres_export.graphs.types import value_types
from attnres_export.graphs.validate import validate_attnres_nodes
from attnres_export.ops.descriptors import OPS, PLUGIN_ATTRIBUTES
from attnres_export.ops.onnx_nodes import attribute
from attnres_export.ops.opset import DOMAIN, OPSET_VERSION, ORT_TRT_DOMAIN

PORTABLE_KEY = "attnres.portable_nodes"
"""Model metadata listing the fused nodes a portable model decomposed, so it can be converted back.

One record per node: ``name``, ``op_type``, ``inputs`` (``""`` for an absent optional input), ``outputs`` and
``attributes`` (all but the plugin ones, which are re-added)."""



def detect_target(model: onnx.ModelProto) -> str:
    """``onnxruntime`` when the graph records that conversion, ``tensorrt`` or ``ort-trt`` when fused nodes are
    present, else ``portable``."""
    if OnnxRuntimeOps.of(model) is not None:
        return "onnxruntime"
    if attnres_nodes(model.graph, ORT_TRT_DOMAIN):
        return "ort-trt"
    return "tensorrt" if attnres_nodes(model.graph) else "portable"


def convert(model: onnx.ModelProto, target: str, data_dir: Path | None = None) -> onnx.ModelProto:
    """A copy of ``model`` written for ``target``. ``data_dir``: the folder of the model's external data files,
    which the ``onnxruntime`` conversion may change in place (an export's private staging folder only)."""
    if target not in TARGETS:
        raise GraphError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    validate_attnres_nodes(model)
    out = copy_model(model)
    source = detect_target(out)
    if source == target == "onnxruntime":
        return out
    if source == "onnxruntime":
        _refuse_onnx_runtime_ops(out, target)
    if source == "ort-trt":
        _move_domain(out, ORT_TRT_DOMAIN, DOMAIN)
    elif source in ("portable", "onnxruntime") and target != "portable" and (
            target != "onnxruntime" or PORTABLE_KEY in metadata(out)):  # else rewritten for onnxruntime as it is
        _refuse_unless_recorded(out)
        _recompose(out)
    if target == "onnxruntime":
        to_onnxruntime(out, _decompose, data_dir)
        return out
    if target == "portable":
        _decompose(out)
        return out
    for node in attnres_nodes(out.graph):
        OPS[node.op_type].compact(node)
    if target == "ort-trt":
        _type_fused_outputs(out)
        _move_domain(out, DOMAIN, ORT_TRT_DOMAIN)
    return out


def _refuse_onnx_runtime_ops(model: onnx.ModelProto, target: str) -> None:
    """An ``onnxruntime`` graph converts back only when the conversion wrote no ONNX Runtime op (its attnres nodes
    were only decomposed); the fused ops' patterns are not recorded."""
    written = OnnxRuntimeOps.of(model).nodes
    if written:
        raise GraphError(f"this ONNX holds ONNX Runtime fused ops of the onnxruntime target "
                         f"({', '.join(f'{n} {op}' for op, n in written.items())}), which do not convert back; "
                         f"re-export the model with --target {target}")
    set_metadata(model, ONNX_RUNTIME_OPS_KEY, None)


def _type_fused_outputs(model: onnx.ModelProto) -> None:
    """Give every output of a fused node an element type in ``value_info`` (the ort-trt form, docs/tensorrt.md).

    ONNX Runtime declares each ``trt.plugins`` op with variadic inputs and outputs of any type
    (``TensorRTCustomOp``), and its custom-op type inference gives up on such outputs: a node output whose type the
    file does not state fails the session with "type inference failed" before the TensorRT provider sees it.
    """
    graph = model.graph
    stated = {v.name: v for v in (*graph.value_info, *graph.output)}
    missing = [name for node in attnres_nodes(graph) for name in node.output
               if name and not stated.get(name, onnx.ValueInfoProto()).type.tensor_type.elem_type]
    if not missing:
        return
    types = value_types(model)
    for name in missing:
        if name in stated:
            stated[name].type.tensor_type.elem_type = types[name]
        else:
            graph.value_info.append(oh.make_tensor_value_info(name, types[name], None))


def _fused_node(record: dict) -> onnx.NodeProto:
    return oh.make_node(
        record["op_type"], record["inputs"], record["outputs"], name=record["name"], domain=DOMAIN,
        **record["attributes"], **PLUGIN_ATTRIBUTES,
    )


def _record(node: onnx.NodeProto) -> dict:
    attributes = {a.name: attribute(node, a.name) for a in node.attribute if a.name not in PLUGIN_ATTRIBUTES}
    return {"name": node.name, "op_type": node.op_type, "inputs": list(node.input), "outputs": list(node.output),
            "attributes": attributes}


def _decompose(model: onnx.ModelProto) -> None:
    graph = model.graph
    fused = attnres_nodes(graph)
    if not fused:
        return
    opset = default_opset(model)
    types = value_types(model)
    fresh = unique_namer(graph, "attnres")
    records, nodes = [], []
    for index, node in enumerate(graph.node):
        if node.domain != DOMAIN:
            nodes.append(node)
            continue
        op = OPS[node.op_type]
        if opset < op.min_opset:
            raise GraphError(f"the portable decomposition of {op.op_type} needs default opset >= {op.min_opset}, "
                             f"the model has {opset}; re-export with --opset {op.min_opset} or later")
        if not node.name:
            node.name = f"{node.op_type}_{index}"
        op.expand(node)
        inputs = op.canonical_inputs(node)
        nodes.extend(op.decompose(node, inputs, types[inputs[op.storage_input]], opset, fresh))
        records.append(_record(node))
    replace_nodes(graph, nodes)
    set_domain_import(model, DOMAIN, None)
    set_metadata(model, PORTABLE_KEY, json.dumps(records))


def _refuse_unless_recorded(model: onnx.ModelProto) -> None:
    if PORTABLE_KEY not in metadata(model):
        raise GraphError(
            "this ONNX has no attnres nodes and no record of decomposed ones (it was not written by "
            "`attnres-export --target portable`); use `attnres fuse` to find aggregations by pattern"
        )


def _recompose(model: onnx.ModelProto) -> None:
    """Replace each recorded decomposition (nodes named ``<name>/...``) by its fused node.

    The fused node goes where the last of its outputs was computed: every input is available there.
    """
    graph = model.graph
    records = json.loads(metadata(model)[PORTABLE_KEY])
    by_prefix = {f"{r['name']}/": r for r in records}
    nodes: list[onnx.NodeProto] = []
    pending: dict[str, list[onnx.NodeProto]] = {p: [] for p in by_prefix}
    for node in graph.node:
        prefix = next((p for p in by_prefix if node.name.startswith(p)), None)
        if prefix is None:
            nodes.append(node)
            continue
        pending[prefix].append(node)
        record = by_prefix[prefix]
        produced = {o for n in pending[prefix] for o in n.output}
        wanted = [o for o in record["outputs"] if o]
        if set(node.output) & set(wanted) and produced.issuperset(wanted):
            nodes.append(_fused_node(record))
    missing = [r["name"] for p, r in by_prefix.items() if not pending[p]]
    if missing:
        raise GraphError(f"recorded attnres nodes {missing[:3]} are not in the graph any more; re-export the model")
    replace_nodes(graph, nodes)
    set_domain_import(model, DOMAIN, OPSET_VERSION)
    set_metadata(model, PORTABLE_KEY, None)


def _move_domain(model: onnx.ModelProto, old: str, new: str) -> None:
    for node in model.graph.node:
        if node.domain == old:
            node.domain = new
    version = next((e.version for e in model.opset_import if e.domain == old), OPSET_VERSION)
    set_domain_import(model, old, None)
    set_domain_import(model, new, version)
