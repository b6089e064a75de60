"""Rotary embeddings as ONNX Runtime's ``RotaryEmbedding``: every rotate-half application of a with-past export
(queries and keys, each layer) becomes one node reading tables evaluated from the graph's own cos/sin, and the
rewritten graph computes the same prefill and decode step on ONNX Runtime; applications written another way
(interleaved pairs, the other sign, uneven halves, halves of cos that differ, cos read from another input) stay."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.onnxruntime_ops.nodes import Nodes, attr
from attnres_export.graphs.onnxruntime_ops.rotary import rotary_embeddings
from attnres_export.models.base import PAST_PREFIX, PRESENT_PREFIX
from tests.conftest import slow_after
from tests.models.decoder.hf_bodies import TINY, hf_model, write_folder

MAX_POSITIONS = TINY["max_position_embeddings"]
BAR = 1e-6
"""Relative L2 of every output against the graph before the rewrite (float32)."""
FAMILIES = {
    "llama": {},
    "qwen3": {"head_dim": 16,  # GroupQueryAttention's CPU kernel takes head sizes that are multiples of 8
              "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                  "original_max_position_embeddings": 32}},  # cos/sin times yarn's factor
}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = _session(model)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64)))


class _Exports:
    """Each family's tiny with-past ``portable``-target export (the rewrite is applied by hand), made on first
    use (about 10 s each)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.paths = folder, {}

    def __getitem__(self, key: str) -> onnx.ModelProto:
        """``family`` or ``family:dtype``."""
        if key not in self.paths:
            family, _, dtype = key.partition(":")
            source = self.folder / family
            if not source.exists():
                write_folder(hf_model(family, 5, **FAMILIES[family]), source)
            out = self.folder / f"{family}-{dtype or 'float32'}.onnx"
            export_checkpoint(ExportOptions(source, out, target="portable", dtype=dtype or "float32",
                                            with_past=True, check=False))
            self.paths[key] = out
        return onnx.load(str(self.paths[key]))


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> _Exports:
    return _Exports(tmp_path_factory.mktemp("rotary"))


def _prefill_then_step(model: onnx.ModelProto, batch: int, seq: int) -> list[dict[str, np.ndarray]]:
    """Outputs of a prefill of ``seq`` tokens from an empty cache, then of one decode step at position ``seq``."""
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    ids = np.random.default_rng(batch * 31 + seq).integers(0, TINY["vocab_size"], size=(batch, seq + 1))
    past = {v.name: np.zeros([batch if d.dim_param == "batch" else 0 if d.dim_param == "past" else d.dim_value
                              for d in v.type.tensor_type.shape.dim],
                             oh.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
            for v in model.graph.input if v.name.startswith(PAST_PREFIX)}
    first = dict(zip(names, session.run(None, {
        "input_ids": ids[:, :seq], "attention_mask": np.ones((batch, seq), np.int64),
        "position_ids": np.tile(np.arange(seq), (batch, 1)), **past}), strict=True))
    past = {name: first[PRESENT_PREFIX + name.removeprefix(PAST_PREFIX)] for name in past}
    second = dict(zip(names, session.run(None, {
        "input_ids": ids[:, seq:], "attention_mask": np.ones((batch, seq + 1), np.int64),
        "position_ids": np.full((batch, 1), seq), **past}), strict=True))
    return [first, second]


@pytest.mark.parametrize("family", slow_after(list(FAMILIES)))
def test_each_rotary_application_becomes_one_node_computing_the_same_prefill_and_decode_step(exports, family):
    before = exports[family]
    model = exports[family]
    layers = sum(v.name.endswith(".key") for v in model.graph.input if v.name.startswith(PAST_PREFIX))
    assert rotary_embeddings(model, MAX_POSITIONS) == 2 * layers == 2 * TINY["num_hidden_layers"]
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["RotaryEmbedding"] == 2 * layers and not ops["Cos"] and not ops["Sin"] and not ops["Neg"]
    assert {n.domain for n in model.graph.node if n.op_type == "RotaryEmbedding"} == {"com.microsoft"}
    caches = {i.name: i for i in model.graph.initializer if i.name.endswith("_cache")}
    head = next(v for v in model.graph.input if v.name.startswith(PAST_PREFIX)).type.tensor_type.shape.dim[3]
    assert sorted(caches) == ["cos_cache", "sin_cache"]  # one pair shared by every layer
    assert all(list(t.dims) == [MAX_POSITIONS, head.dim_value // 2] and t.data_type == TensorProto.FLOAT
               for t in caches.values())
    for batch, seq in [(3, 5), (1, 1)]:
        for want, got in zip(_prefill_then_step(before, batch, seq), _prefill_then_step(model, batch, seq),
                             strict=True):
            assert want.keys() == got.keys()
            for name in want:
                assert _rel(got[name], want[name]) < BAR, (batch, seq, name)


def test_tables_evaluated_by_onnx_runtime_are_its_own_cos_and_sin_and_within_an_ulp_of_the_reference(exports):
    reference, runtime = exports["llama"], exports["llama"]
    assert rotary_embeddings(reference, MAX_POSITIONS) == rotary_embeddings(runtime, MAX_POSITIONS, run=_ort_run)
    tables = [{i.name: numpy_helper.to_array(i) for i in m.graph.initializer if i.name.endswith("_cache")}
              for m in (reference, runtime)]
    for name in ("cos_cache", "sin_cache"):
        assert np.abs(tables[0][name] - tables[1][name]).max() <= 2.5e-7, name
    for want, got in zip(_prefill_then_step(reference, 3, 5), _prefill_then_step(runtime, 3, 5), strict=True):
        for name in want:
            assert _rel(got[name], want[name]) < BAR, name


@pytest.mark.slow
def test_a_float16_export_is_rewritten_in_its_float32_rotary_between_the_casts(exports):
    """A float16 export rotates in float32 (``models/decoder/rope.py:rotate``): the op reads the Cast to float32,
    with float32 tables, and the Cast back to float16 stays, so the outputs are those of the graph before."""
    before, model = exports["llama:float16"], exports["llama:float16"]
    assert rotary_embeddings(model, MAX_POSITIONS) == 2 * TINY["num_hidden_layers"]
    nodes = Nodes(model.graph)
    for node in (n for n in model.graph.node if n.op_type == "RotaryEmbedding"):
        cast = nodes.producer(node.input[0])
        assert cast.op_type == "Cast" and attr(cast, "to", 0) == TensorProto.FLOAT
        assert [(r.op_type, attr(r, "to", 0)) for r in nodes.consumers[node.output[0]]] == [
            ("Cast", TensorProto.FLOAT16)]
    for want, got in zip(_prefill_then_step(before, 3, 5), _prefill_then_step(model, 3, 5), strict=True):
        for name in want:
            assert _rel(got[name], want[name]) < 1e-3, name  # float16 rounding of a float32 difference below 1e-6


HALF, HEADS = 4, 2


def _rope_graph(variant: str) -> onnx.ModelProto:
    """``y = x * cos + rotate_half(x) * sin`` over ``x [batch, 2, seq, 8]``, written as the exporter writes it
    (``exact``) or another way."""
    init = [numpy_helper.from_array(np.array(v, dtype), name) for name, v, dtype in (
        ("inv_freq", 1.0 / 10000 ** (np.arange(HALF) / HALF), np.float32), ("two", 2.0, np.float32),
        ("last", [-1], np.int64), ("heads_axis", [1], np.int64), ("zero", [0], np.int64), ("one", [1], np.int64),
        ("three", [3], np.int64), ("half", [HALF], np.int64), ("end", [2 * HALF], np.int64),
        ("big", [np.iinfo(np.int64).max], np.int64), ("step2", [2], np.int64), ("s0", 0, np.int64),
        ("s1", 1, np.int64), ("zero_f", 0.0, np.float32))]
    angle = {"other input": ["Add", ["pos_f", "mask_f"]],
             "positions from the shape": ["Identity", ["range_f"]]}.get(variant, ["Identity", ["pos_f"]])
    second_freqs = ["Mul", ["freqs", "two"]] if variant == "halves differ" else ["Identity", ["freqs"]]
    nodes = [
        oh.make_node("Unsqueeze", ["position_ids", "last"], ["pos_u"]),
        oh.make_node("Cast", ["pos_u"], ["pos_f"], to=TensorProto.FLOAT),
        oh.make_node("Unsqueeze", ["attention_mask", "last"], ["mask_u"]),
        oh.make_node("Cast", ["mask_u"], ["mask_f"], to=TensorProto.FLOAT),
        oh.make_node("Shape", ["position_ids"], ["seq_1d"], start=1, end=2),  # 0 * positions + arange(seq)
        oh.make_node("Squeeze", ["seq_1d"], ["seq_len"]),
        oh.make_node("Range", ["s0", "seq_len", "s1"], ["arange"]),
        oh.make_node("Cast", ["arange"], ["arange_f"], to=TensorProto.FLOAT),
        oh.make_node("Unsqueeze", ["arange_f", "last"], ["arange_u"]),
        oh.make_node("Mul", ["pos_f", "zero_f"], ["pos_0"]),
        oh.make_node("Add", ["pos_0", "arange_u"], ["range_f"]),
        oh.make_node(angle[0], angle[1], ["angle"]),
        oh.make_node("Mul", ["angle", "inv_freq"], ["freqs"]),
        oh.make_node(second_freqs[0], second_freqs[1], ["freqs2"]),
        oh.make_node("Concat", ["freqs", "freqs2"], ["emb"], axis=-1),
        oh.make_node("Cos", ["emb"], ["cos3"]), oh.make_node("Sin", ["emb"], ["sin3"]),
        oh.make_node("Unsqueeze", ["cos3", "heads_axis"], ["cos"]),
        oh.make_node("Unsqueeze", ["sin3", "heads_axis"], ["sin"]),
    ]
    if variant == "interleaved pairs":
        halves = [("zero", "end", "step2"), ("one", "end", "step2")]
    elif variant == "uneven halves":
        halves = [("zero", "three", "one"), ("three", "big", "one")]
    else:
        halves = [("zero", "half", "one"), ("half", "big", "one")]
    nodes += [oh.make_node("Slice", ["x", start, end, "last", step], [name])
              for name, (start, end, step) in zip(["first", "second"], halves, strict=True)]
    rotated = ["second", "neg"] if variant == "other sign" else ["neg", "first"]
    nodes += [
        oh.make_node("Neg", ["first" if variant == "other sign" else "second"], ["neg"]),
        oh.make_node("Concat", rotated, ["rot"], axis=-1),
        oh.make_node("Mul", ["x", "cos"], ["direct"]), oh.make_node("Mul", ["rot", "sin"], ["turned"]),
        oh.make_node("Add", ["direct", "turned"], ["y"]),
    ]
    used = {name for node in nodes for name in node.input}
    init = [tensor for tensor in init if tensor.name in used]
    value = oh.make_tensor_value_info
    graph = oh.make_graph(nodes, variant, [
        value("x", TensorProto.FLOAT, ["batch", HEADS, "seq", 2 * HALF]),
        value("position_ids", TensorProto.INT64, ["batch", "seq"]),
        value("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [value("y", TensorProto.FLOAT, ["batch", HEADS, "seq", 2 * HALF])], init)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _feeds(positions: np.ndarray) -> dict[str, np.ndarray]:
    batch, seq = positions.shape
    x = np.random.default_rng(0).standard_normal((batch, HEADS, seq, 2 * HALF)).astype(np.float32)
    return {"x": x, "position_ids": positions, "attention_mask": np.ones_like(positions)}


def test_the_exact_pattern_is_rewritten_and_computes_the_same_at_scattered_positions():
    before, model = _rope_graph("exact"), _rope_graph("exact")
    assert rotary_embeddings(model, 32) == 1
    assert [n.op_type for n in model.graph.node] == ["RotaryEmbedding"]
    onnx.checker.check_model(model)
    feeds = _feeds(np.array([[0, 5, 9], [31, 2, 2]], np.int64))
    assert _rel(_ort_run(model, feeds)["y"], _ort_run(before, feeds)["y"]) < BAR


@pytest.mark.parametrize("variant", ["interleaved pairs", "other sign", "uneven halves", "halves differ",
                                     "other input", "positions from the shape"])
def test_an_application_written_another_way_is_left_as_it_is(variant):
    model = _rope_graph(variant)
    before = model.SerializeToString()
    assert rotary_embeddings(model, 32) == 0
    assert model.SerializeToString() == before
    assert _ort_run(model, _feeds(np.array([[3, 1, 4], [1, 5, 9]], np.int64)))["y"].shape == (2, HEADS, 3, 2 * HALF)
