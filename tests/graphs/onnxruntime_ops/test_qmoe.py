"""Quantized experts as ONNX Runtime's ``QMoE``: what the op computes on CPU (a standalone node against a float64
NumPy reference: 4-bit blocks and one scale per row exactly, 8-bit blocks not), the in-place
rewrite of a stack in a one-file staging layout, and quantized folder exports whose experts become ``QMoE`` and
compute what the graph of standard ops computes (or stay, saying why)."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto
from onnx import helper as oh

from attnres_export.graphs.onnxruntime_ops.qmoe import _frame, _reframed
from tests.conftest import slow_after
from tests.graphs.onnxruntime_ops.test_experts import _export, _feeds, _qwen3_moe_folder, _session
from tests.models.decoder.hf_bodies import hf_model, write_folder
from tests.models.kimi.lm_reference import folder_of as kimi_folder_of
from tests.models.kimi.lm_reference import hf_model as kimi_hf_model

EXACT = 2e-6
"""Relative L2 of a float32 computation of the same dequantized weights against float64 (measured up to 6e-7)."""


def _packed(unsigned: np.ndarray, bits: int) -> np.ndarray:
    """Bytes along the last axis: 4-bit two to a byte, low nibble first, an odd row padded with 0."""
    unsigned = unsigned.astype(np.uint8)
    if bits == 8:
        return unsigned
    if unsigned.shape[-1] % 2:
        unsigned = np.concatenate([unsigned, np.zeros((*unsigned.shape[:-1], 1), np.uint8)], axis=-1)
    return unsigned[..., 0::2] | (unsigned[..., 1::2] << 4)


def _qmoe_against_numpy(bits: int, block: int | None, zero_points: bool, tokens: int, hidden: int = 64,
                        inner: int = 96, experts: int = 8, k: int = 2, seed: int = 0) -> float:
    """Relative L2 of a standalone ``QMoE`` node (random blocks, routing and input) against float64 NumPy:
    softmax of the router probabilities, top k renormalised, ``silu(g) * u`` on interleaved rows."""
    rng = np.random.default_rng(seed)
    low, high = -(1 << (bits - 1)), 1 << (bits - 1)
    shapes = {"fc1": (experts, 2 * inner, hidden), "fc2": (experts, hidden, inner)}
    weights, initializers = {}, []
    for name, (e, n, width) in shapes.items():
        blocks = -(-width // block) if block else 1
        values = rng.integers(low, high, (e, n, width))
        scales = (rng.random((e, n, blocks)) * 0.02 + 0.001).astype(np.float32)
        points = rng.integers(low, high, (e, n, blocks)) if zero_points else np.zeros((e, n, blocks), np.int64)
        columns = (np.arange(width) // (block or width))
        weights[name] = (values - points[..., columns]) * scales[..., columns].astype(np.float64)
        initializers += [oh.make_tensor(name, TensorProto.UINT8, [e, n, width * bits // 8],
                                        _packed(values + high, bits).tobytes(), raw=True),
                         onnx.numpy_helper.from_array(scales if block else scales[..., 0], f"{name}_scales")]
        if zero_points:
            offset = points + high
            initializers.append(onnx.numpy_helper.from_array(
                _packed(offset if block else offset[..., 0], bits), f"{name}_zero_points"))
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    probs = rng.standard_normal((tokens, experts)).astype(np.float32)
    share = np.exp(probs - probs.max(1, keepdims=True))
    expected = np.zeros((tokens, hidden))
    for t in range(tokens):
        top = np.argsort(-share[t], kind="stable")[:k]
        for e, w in zip(top, share[t, top] / share[t, top].sum(), strict=True):
            h = weights["fc1"][e] @ x[t].astype(np.float64)
            expected[t] += w * (weights["fc2"][e] @ (h[0::2] / (1 + np.exp(-h[0::2])) * h[1::2]))
    inputs = ["x", "probs", "fc1", "fc1_scales", "", "fc2", "fc2_scales"]
    if zero_points:
        inputs += ["", "", "", "", "fc1_zero_points", "fc2_zero_points"]
    node = oh.make_node("QMoE", inputs, ["y"], domain="com.microsoft", k=k, expert_weight_bits=bits,
                        activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
                        normalize_routing_weights=1, quant_type="int", weights_prepacked=0, accuracy_level=0,
                        **({"block_size": block} if block else {}))
    graph = oh.make_graph([node], "qmoe", [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", hidden]),
                                           oh.make_tensor_value_info("probs", TensorProto.FLOAT, ["n", experts])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["n", hidden])], initializers)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.log_severity_level = 3  # a partial block's fallback warning
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x, "probs": probs})[0]
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize(("bits", "block", "zero_points", "tokens"), [
    (4, 16, False, 1), (4, 16, True, 7), (4, 32, False, 33), (4, 32, True, 1), (4, 32, True, 7),
    (8, None, False, 7), (8, None, True, 33), (4, None, True, 5)])
def test_qmoe_on_cpu_computes_4_bit_blocks_and_one_scale_per_row_in_float32(bits, block, zero_points, tokens):
    assert _qmoe_against_numpy(bits, block, zero_points, tokens) <= EXACT


def test_qmoe_on_cpu_computes_4_bit_blocks_of_128_in_float32():
    assert _qmoe_against_numpy(4, 128, True, 9, hidden=128, inner=256, experts=16, k=4) <= EXACT


@pytest.mark.parametrize("block", [16, 32])
def test_qmoe_on_cpu_computes_8_bit_blocks_on_int8_activations_so_such_experts_stay(block):
    assert _qmoe_against_numpy(8, block, False, 7) > 1e-3


@pytest.mark.parametrize(("hidden", "inner", "block", "bits"), [(64, 80, 32, 4), (64, 96, 64, 4), (64, 96, 128, 8)])
def test_qmoe_on_cpu_computes_partial_blocks_exactly_through_its_fallback(hidden, inner, block, bits):
    """Its schema asks for blocks dividing K; the CPU kernel dequantizes others (warning), exactly: the rewrite
    keeps such experts for the schema and the warning, and writes one block per row without ``block_size``."""
    assert _qmoe_against_numpy(bits, block, True, 5, hidden=hidden, inner=inner) <= EXACT


@pytest.mark.parametrize(("old", "new"), [(0, 0), (1, 1), (100, 98), (4096, 2048), (300, 149), (70000, 35000),
                                          (16384, 16250), (130, 127), (256, 128)])
def test_a_reframed_tensor_reads_alone_in_its_one_file_bytes(old, new):
    """A staged one-file layout holds a tensor's bytes after a ``graph.initializer`` frame; rewritten as ``new``
    bytes of another type within the same ``old`` bytes, the bytes followed by the rest of a model parse as that
    model with the new tensor and nothing else."""
    rest = oh.make_model(oh.make_graph([], "g", [], []), opset_imports=[oh.make_opsetid("", 21)])
    data = np.arange(new, dtype=np.uint8)
    size = len(_frame("t", TensorProto.INT8, [old], old)) + old
    region = _reframed("t", TensorProto.UINT8, [new], data.tobytes(), size)
    assert len(region) == size
    model = onnx.ModelProto.FromString(region + rest.SerializeToString())
    (tensor,) = model.graph.initializer
    assert (tensor.name, tensor.data_type, list(tensor.dims), tensor.doc_string) == ("t", TensorProto.UINT8, [new], "")
    assert (onnx.numpy_helper.to_array(tensor) == data).all()


# --- quantized folders ------------------------------------------------------------------------------------------


def _deepseek_v3_folder(path: Path):
    reference = hf_model("deepseek_v3", seed=8, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
                         n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                         hidden_size=64, moe_intermediate_size=32)
    return reference, write_folder(reference, path)


def _qwen3_moe_wide_folder(path: Path):
    """Hidden size 64 and intermediate size 96: blocks of 16 and 32 divide both, 64 does not."""
    reference = hf_model("qwen3_moe", seed=7, num_hidden_layers=2, mlp_only_layers=[], num_experts=8,
                         hidden_size=64, moe_intermediate_size=96)
    return reference, write_folder(reference, path)


def _kimi_linear_k3_folder(path: Path):
    """Kimi Linear (sigmoid routing with correction bias over 2 groups, a shared expert, KDA and latent attention)
    with K3's Attention Residuals, block of 2 layers; hidden 32, experts 16 wide: blocks of 16 divide both."""
    reference = kimi_hf_model(3)
    return reference, kimi_folder_of(reference, path, attn_res_block_size=2)[0]


FOLDERS = {"qwen3_moe": _qwen3_moe_folder, "qwen3_moe_wide": _qwen3_moe_wide_folder,
           "deepseek_v3": _deepseek_v3_folder, "kimi_linear_k3": _kimi_linear_k3_folder}
CASES = [  # folder, --quantize, block, with past, QMoE layers of 2 (else 0 and the kept line's words)
    ("qwen3_moe_wide", "int4", 32, False, 2, ""),
    ("qwen3_moe_wide", "int4", 16, True, 2, ""),
    ("deepseek_v3", "int4", 32, True, 1, ""),
    ("kimi_linear_k3", "int4", 16, True, 2, ""),
    ("qwen3_moe", "int8", 32, False, 2, ""),  # hidden 32, intermediate 40: one block per row at most
    ("qwen3_moe_wide", "int8", 32, False, 0, "8-bit values in blocks of 32"),
    ("qwen3_moe_wide", "int4", 64, False, 0, "partial block"),
]


def _onnxruntime_export(folder: Path, out: Path, quantize: str, block: int, with_past: bool) -> onnx.ModelProto:
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    export_checkpoint(ExportOptions(folder, out, target="onnxruntime", with_past=with_past, seq=DimRange(1, 8, 32),
                                    past=DimRange(0, 8, 31) if with_past else None, check=False,
                                    quantize=quantize, quantize_block_size=block))
    return onnx.load(str(out))


@pytest.mark.parametrize(("name", "quantize", "block", "with_past", "layers", "kept"), slow_after(CASES))
@torch.inference_mode()
def test_quantized_folder_exports_write_qmoe_that_computes_what_the_standard_ops_compute(
        tmp_path, name, quantize, block, with_past, layers, kept):
    """The published one-file ``onnxruntime`` export against the ``portable`` one of the same quantized folder
    (the same blocks, dequantized by standard ops), on ONNX Runtime."""
    _, folder = FOLDERS[name](tmp_path / name)
    model = _onnxruntime_export(folder, tmp_path / "ort" / "model.onnx", quantize, block, with_past)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["QMoE"] == layers
    record = next(p.value for p in model.metadata_props if p.key == "attnres.onnxruntime_ops")
    assert (kept in record) if kept else "experts:" not in record
    if not layers:
        return
    assert not any(i.doc_string for i in model.graph.initializer)
    options = ort.SessionOptions()
    # the portable graph's dense DequantizeLinear -> MatMul fuse into MatMulNBits at ONNX Runtime's default
    # accuracy level 4 (int8 activations); the onnxruntime export writes them at level 0
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    portable = _export(folder, tmp_path / "portable" / "model.onnx", with_past=with_past, quantize=quantize,
                       block=block)
    portable = ort.InferenceSession(portable.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session = _session(model)
    g = torch.Generator().manual_seed(11)
    for batch, seq in [(1, 1), (3, 5), (2, 9)]:
        ids = torch.randint(0, 61, (batch, seq), generator=g)
        got = session.run(["logits"], _feeds(session, ids))[0]
        expected = portable.run(["logits"], _feeds(portable, ids))[0]
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5, (batch, seq)
