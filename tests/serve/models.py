"""A tiny hand-built ONNX shaped like an attnres-export model (``input_ids [batch, seq]`` int64 -> ``logits
[batch, seq, 4]`` float32, export metadata with batch 1:4:16 and seq 1:8:64): the repository tests need its
signature, not a real export (which takes seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from attnres_export.graphs.metadata import EXPORT_KEY


def tiny_onnx(path: Path, batch: tuple[int, int, int] = (1, 4, 16)) -> Path:
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0, -2.0, 0.5, 3.0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["ids_f", "axes"], ["ids_u"]),
         helper.make_node("Mul", ["ids_u", "scale"], ["logits"])],
        "tiny",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 4])],
        [scale, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    info = {"dtype": "float32", "target": "portable", "dims": {"batch": list(batch), "seq": [1, 8, 64]},
            "inputs": {"input_ids": ["batch", "seq"]}}
    helper.set_model_props(model, {EXPORT_KEY: json.dumps(info)})
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def with_past_onnx(vocab: int = 5, max_seq_len: int = 16) -> onnx.ModelProto:
    """The inputs and export metadata of a ``--with-past`` export (one layer, two heads of size 4): ids,
    attention mask over ``total = past + seq``, position ids and one past key; ``logits`` from the ids alone.
    For the request limits, which read the signature and metadata, not the computation."""
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [vocab], [1.0] * vocab)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, ["batch", 2, "past", 4])]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["ids_f", "axes"], ["ids_u"]),
         helper.make_node("Mul", ["ids_u", "scale"], ["logits"])],
        "with_past", inputs, [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])],
        [scale, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    info = {"dtype": "float32", "target": "portable", "with_past": True, "vocab_size": vocab,
            "max_seq_len": max_seq_len,
            "dims": {"batch": [1, 1, 4], "seq": [1, 1, max_seq_len], "past": [0, 3, max_seq_len - 1],
                     "total": [1, 4, max_seq_len]},
            "inputs": {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "total"],
                       "position_ids": ["batch", "seq"], "past_key_values.0.key": ["batch", 2, "past", 4]}}
    helper.set_model_props(model, {EXPORT_KEY: json.dumps(info)})
    onnx.checker.check_model(model, full_check=True)
    return model
