"""GroupQueryAttention in the ``onnxruntime`` target's with-past graph reads each layer's projections in its packed
``[batch, seq, heads * head]`` form: no Transpose to heads-first and back and no Reshape to heads and back around
it, rotary applied to the packed form (or, on a head size its kernel rotates, inside it), and the graph computes
what the standard-op graph before the conversion computes, prefill and decode, at a single token, odd lengths and
positions other than the cache length."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.onnxruntime_ops.nodes import Nodes, attr
from attnres_export.graphs.targets import convert
from attnres_export.models.base import PAST_PREFIX, PRESENT_PREFIX
from tests.models.decoder.hf_bodies import TINY, hf_model, write_folder

BAR = 1e-6
"""Relative L2 of every output against the standard-op graph (float32; ONNX Runtime's rotary rounds the same
products another way)."""
FAMILIES = {
    "llama": {},  # head size 8: GroupQueryAttention's CPU kernel rotates multiples of 16 only
    "qwen3": {"head_dim": 16},  # per-head q_norm/k_norm between the projections and rotary
}
INPUT_CHAINS = {
    "llama": [["RotaryEmbedding", "MatMul"], ["RotaryEmbedding", "MatMul"], ["MatMul"]],
    "qwen3": [["Reshape", "SimplifiedLayerNormalization", "Reshape", "MatMul"]] * 2 + [["MatMul"]],
}
"""What GroupQueryAttention's query, key and value are computed by, back to the projection (first inputs)."""


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Callable[[str], Path]:
    """Each family's tiny with-past ``portable`` export (standard-op attention), by ``family`` or
    ``family:dtype``, made on first use."""
    folder, paths = tmp_path_factory.mktemp("attention"), {}

    def export(key: str) -> Path:
        if key not in paths:
            family, _, dtype = key.partition(":")
            source = folder / family
            if not source.exists():
                write_folder(hf_model(family, 5, **FAMILIES[family]), source)
            paths[key] = folder / f"{family}-{dtype or 'float32'}.onnx"
            export_checkpoint(ExportOptions(source, paths[key], target="portable", dtype=dtype or "float32",
                                            with_past=True, check=False))
        return paths[key]

    return export


def _run(model: onnx.ModelProto, steps: list[np.ndarray], seed: int) -> list[dict[str, np.ndarray]]:
    """Outputs of a prompt from an empty cache at ``steps[0]``'s ``[batch, seq]`` positions, then of each further
    step at its positions on the cache the step before wrote."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    batch = steps[0].shape[0]
    ids = np.random.default_rng(seed).integers(0, TINY["vocab_size"], size=(batch, sum(s.shape[1] for s in steps)))
    past = {v.name: np.zeros([batch if d.dim_param == "batch" else 0 if d.dim_param == "past" else d.dim_value
                              for d in v.type.tensor_type.shape.dim],
                             oh.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
            for v in model.graph.input if v.name.startswith(PAST_PREFIX)}
    outputs, done = [], 0
    for positions in steps:
        seq = positions.shape[1]
        out = dict(zip(names, session.run(None, {
            "input_ids": ids[:, done:done + seq], "attention_mask": np.ones((batch, done + seq), np.int64),
            "position_ids": positions.astype(np.int64), **past}), strict=True))
        past = {name: out[PRESENT_PREFIX + name.removeprefix(PAST_PREFIX)] for name in past}
        outputs.append(out)
        done += seq
    return outputs


def _assert_same(before: onnx.ModelProto, after: onnx.ModelProto, steps: list[np.ndarray], bar: float) -> None:
    for i, (want, got) in enumerate(zip(_run(before, steps, len(steps)), _run(after, steps, len(steps)),
                                        strict=True)):
        assert want.keys() == got.keys()
        for name in want:
            assert _rel(got[name], want[name]) < bar, (i, name)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64)))


def _chain(nodes: Nodes, name: str) -> list[str]:
    """Op types from ``name`` back through first inputs to the first MatMul."""
    types = []
    while (node := nodes.producer(name)) is not None:
        types.append(node.op_type)
        if node.op_type == "MatMul":
            break
        name = node.input[0]
    return types


@pytest.mark.parametrize("family", list(FAMILIES))
def test_group_query_attention_reads_the_packed_projections_with_no_transpose_or_head_reshape_around_it(
        exports, family):
    model = convert(onnx.load(str(exports(family))), "onnxruntime")
    layers = TINY["num_hidden_layers"]
    ops = collections.Counter(n.op_type for n in model.graph.node)
    nodes = Nodes(model.graph)
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    rotates = family == "qwen3"
    assert len(attention) == layers and ops["Transpose"] == ops["Concat"] == 0
    assert ops["RotaryEmbedding"] == (0 if rotates else 2 * layers)
    assert [n.input[0] for n in model.graph.node if n.op_type == "Shape"] == ["attention_mask"]  # seqlens_k only
    for node in attention:
        assert [_chain(nodes, name) for name in node.input[:3]] == INPUT_CHAINS[family]
        assert attr(node, "do_rotary", 0) == int(rotates)
        assert list(node.input[7:]) == (["cos_cache", "sin_cache", "position_ids"] if rotates else [])
    onnx.checker.check_model(model)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (1, 7), (3, 5), (2, 1)])
def test_the_packed_form_computes_the_same_prefill_and_decode_steps_as_the_standard_op_graph(exports, family,
                                                                                           batch, seq):
    before = onnx.load(str(exports(family)))
    after = convert(before, "onnxruntime")
    steps = [np.tile(np.arange(seq), (batch, 1)), np.full((batch, 1), seq), np.full((batch, 1), seq + 1)]
    _assert_same(before, after, steps, BAR)


def test_rotary_inside_group_query_attention_reads_a_steps_position_ids_and_a_prompts_first_position(exports):
    """GroupQueryAttention rotates a step with a cache at its ``position_ids``, not at the cache length it derives
    from ``seqlens_k``, and a prompt from ``position_ids[0, 0]`` onwards (attention.py:_inner_rotary)."""
    before = onnx.load(str(exports("qwen3")))
    after = convert(before, "onnxruntime")
    assert {attr(n, "do_rotary", 0) for n in after.graph.node if n.op_type == "GroupQueryAttention"} == {1}
    _assert_same(before, after, [np.tile(np.arange(2, 7), (2, 1)), np.array([[9], [2]]), np.array([[3], [3]])], BAR)


def test_a_prompt_whose_rows_start_at_different_positions_is_rotated_from_the_first_rows_start(exports):
    """The limit of rotary inside GroupQueryAttention, as ONNX Runtime 1.32 computes it: a prompt over an empty
    cache reads ``position_ids[0, 0]`` alone, so a second row starting elsewhere (left padding, which
    GroupQueryAttention does not attend right anyway) caches keys rotated from the first row's start."""
    before = onnx.load(str(exports("qwen3")))
    after = convert(before, "onnxruntime")
    positions = [np.stack([np.arange(5), np.arange(3, 8)])]
    [want], [got] = _run(before, positions, 0), _run(after, positions, 0)
    key = f"{PRESENT_PREFIX}0.key"
    assert _rel(got[key][0], want[key][0]) < BAR and _rel(got[key][1], want[key][1]) > 0.1


@pytest.mark.slow
def test_a_float16_export_rotates_the_packed_projections_in_float32_outside_group_query_attention(exports):
    """A float16 model's rotary runs in float32 between Casts (``models/decoder/rope.py:rotate``); the op would
    rotate in float16, so the Casts and RotaryEmbedding stay, on the packed form."""
    before = onnx.load(str(exports("qwen3:float16")))
    after = convert(before, "onnxruntime")
    nodes = Nodes(after.graph)
    attention = [n for n in after.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == TINY["num_hidden_layers"] and not any(n.op_type == "Transpose" for n in after.graph.node)
    for node in attention:
        assert attr(node, "do_rotary", 0) == 0
        for name in node.input[:2]:
            assert _chain(nodes, name)[:3] == ["Cast", "RotaryEmbedding", "Cast"]
            cast = nodes.producer(name)
            assert attr(cast, "to", 0) == TensorProto.FLOAT16
    _assert_same(before, after, [np.tile(np.arange(5), (3, 1)), np.full((3, 1), 5)], 1e-3)
