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


def cache_graph(path: Path, cache: list, dtype: str, vocab: int = 8, max_seq_len: int = 16,
                batch: tuple[int, int, int] = (1, 2, 4)) -> Path:
    """A graph with the inputs, outputs and export metadata a ``--with-past`` export of a model whose
    ``cache_inputs()`` is ``cache`` (``models/base.py:CacheInput``) has in ``dtype``: ids, mask and positions, each
    state in and out (``past`` grows to ``total`` in the presents), ``logits``; each present is its past (the
    serving side reads the signature and metadata, not the computation). Writes it to ``path``."""
    from attnres_export.models.base import step_input_axes, step_output_names

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
    axes = step_input_axes(cache)
    held = {c.name: elem[dtype if c.dtype == "model" else c.dtype] for c in cache}
    inputs = [helper.make_tensor_value_info(name, held.get(name, TensorProto.INT64), list(labels))
              for name, labels in axes.items()]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])]
    outputs += [helper.make_tensor_value_info(c.present, held[c.name],
                                              ["total" if a == "past" else a for a in c.axes]) for c in cache]
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [vocab], [1.0] * vocab)
    unsqueeze = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["ids_f", "axes"], ["ids_u"]),
             helper.make_node("Mul", ["ids_u", "scale"], ["logits"])]
    nodes += [helper.make_node("Identity", [c.name], [c.present]) for c in cache]
    assert step_output_names(cache) == [o.name for o in outputs]
    model = helper.make_model(helper.make_graph(nodes, "cache", inputs, outputs, [scale, unsqueeze]),
                              opset_imports=[helper.make_opsetid("", 18)])
    dims = {"batch": list(batch), "seq": [1, 1, max_seq_len], "past": [0, 3, max_seq_len - 1],
            "total": [1, 4, max_seq_len]}
    info = {"dtype": dtype, "target": "portable", "with_past": True, "vocab_size": vocab, "max_seq_len": max_seq_len,
            "dims": dims, "inputs": {name: list(labels) for name, labels in axes.items()}}
    helper.set_model_props(model, {EXPORT_KEY: json.dumps(info)})
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
