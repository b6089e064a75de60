"""Small hand-built ONNX models for engine tests (no export, no TensorRT)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh


def token_model(dims: dict | None = None, batch: str | int = "batch", seq: str | int = "seq",
                with_metadata: bool = True) -> onnx.ModelProto:
    """``input_ids [batch, seq]`` -> float logits ``[batch, seq, 1]``, with attnres-export metadata."""
    ids = oh.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq])
    out = oh.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, seq, 1])
    nodes = [oh.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
             oh.make_node("Unsqueeze", ["f", "axes"], ["logits"])]
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    graph = oh.make_graph(nodes, "tokens", [ids], [out], [axes])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    if with_metadata:
        meta = {"dtype": "float32", "op_set_version": 1, "target": "tensorrt",
                "dims": dims if dims is not None else {"batch": [1, 2, 8], "seq": [1, 16, 64]},
                "inputs": {"input_ids": ["batch", "seq"]}}
        model.metadata_props.append(onnx.StringStringEntryProto(key="attnres.export", value=json.dumps(meta)))
    return model


def past_model(past_type: int = TensorProto.FLOAT16, dims: dict | None = None) -> onnx.ModelProto:
    """A with-past graph's inputs and outputs (docs/decode.md) with attnres-export metadata: ``input_ids [batch,
    seq]``, ``attention_mask [batch, total]``, one ``past_key_values.0.key [batch, 2, past, 4]`` of ``past_type`` ->
    float32 ``logits [batch, seq, 1]`` and ``present.0.key [batch, 2, total, 4]``. Recorded dims by default: batch
    1:1:4, seq 1:1:16, past 0:8:15 and total 1:9:16 (what ``with_past_ranges`` derives for max_seq_len 16)."""
    past = "past_key_values.0.key"
    inputs = [oh.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              oh.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
              oh.make_tensor_value_info(past, past_type, ["batch", 2, "past", 4])]
    outputs = [oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 1]),
               oh.make_tensor_value_info("present.0.key", past_type, ["batch", 2, "total", 4])]
    nodes = [oh.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
             oh.make_node("Unsqueeze", ["f", "axes"], ["logits"]),
             oh.make_node("Identity", [past], ["present.0.key"])]
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    model = oh.make_model(oh.make_graph(nodes, "with_past", inputs, outputs, [axes]),
                          opset_imports=[oh.make_opsetid("", 18)])
    meta = {"dtype": "float16", "op_set_version": 1, "target": "tensorrt", "with_past": True,
            "dims": dims or {"batch": [1, 1, 4], "seq": [1, 1, 16], "past": [0, 8, 15], "total": [1, 9, 16]},
            "inputs": {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "total"],
                       past: ["batch", 2, "past", 4]}}
    model.metadata_props.append(onnx.StringStringEntryProto(key="attnres.export", value=json.dumps(meta)))
    return model


def aggregate_model(source_type: int = TensorProto.FLOAT, weight_type: int = TensorProto.FLOAT,
                    version: str | None = "1", namespace: str | None = "attnres", domain: str = "attnres",
                    with_function: bool = False, second_source_type: int | None = None,
                    function_domain: str | None = None, vendor_plugin: bool = False) -> onnx.ModelProto:
    """One AttnResAggregate node over two ``[4, 8]`` sources, with the given types and plugin attributes.

    ``function_domain``: the domain of the model-local function (``with_function``), by default the node's.
    ``vendor_plugin``: the output goes through a ``VendorScale`` plugin node (domain and namespace ``vendor``),
    a plugin from another library.
    """
    attrs = {"eps": 1e-6}
    if version is not None:
        attrs["plugin_version"] = version
    if namespace is not None:
        attrs["plugin_namespace"] = namespace
    out = "h0" if vendor_plugin else "h"
    nodes = [oh.make_node("AttnResAggregate", ["sw", "x0", "x1"], [out], name="agg0", domain=domain, **attrs)]
    if vendor_plugin:
        nodes.append(oh.make_node("VendorScale", [out], ["h"], name="scale0", domain="vendor",
                                  plugin_version="1", plugin_namespace="vendor"))
    inputs = [oh.make_tensor_value_info("sw", weight_type, [8]),
              oh.make_tensor_value_info("x0", source_type, [4, 8]),
              oh.make_tensor_value_info("x1", second_source_type or source_type, [4, 8])]
    graph = oh.make_graph(nodes, "agg", inputs, [oh.make_tensor_value_info("h", source_type, [4, 8])])
    functions = []
    if with_function:
        body = [oh.make_node("Identity", ["x0"], ["h"])]
        functions.append(oh.make_function(function_domain or domain, "AttnResAggregate", ["sw", "x0", "x1"], ["h"],
                                          body, [oh.make_opsetid("", 18)]))
    opsets = [oh.make_opsetid("", 18), oh.make_opsetid(domain, 1)]
    if vendor_plugin:
        opsets.append(oh.make_opsetid("vendor", 1))
    return oh.make_model(graph, opset_imports=opsets, functions=functions)
