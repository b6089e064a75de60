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
