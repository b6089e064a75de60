"""FP8 blocks against a NumPy reference written here from the format description (DeepSeek-V3 / Qwen3
``weight_scale_inv``), and GPTQ / AWQ against their reference arithmetic written here (pack, then unpack with
``(q - zero) * scale``). auto-gptq, autoawq and gptqmodel are not used: see docs/quantization.md."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.models.store.quantized import quantized_view

from .helpers import prefixed, stored

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def fp8_reference(weight: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Element (i, j) times scale_inv[i // block_rows, j // block_cols], in float64, loop over blocks."""
    out = np.empty(weight.shape, dtype=np.float64)
    rows, cols = block
    for bi in range(scale_inv.shape[0]):
        for bj in range(scale_inv.shape[1]):
            out[bi * rows:(bi + 1) * rows, bj * cols:(bj + 1) * cols] = (
                weight[bi * rows:(bi + 1) * rows, bj * cols:(bj + 1) * cols] * np.float64(scale_inv[bi, bj]))
    return out


@pytest.mark.parametrize("shape", [(128, 128), (300, 200), (1, 129), (257, 7)])
@pytest.mark.parametrize("block", [(128, 128), (64, 32)])
def test_fp8_block_equals_reference(shape, block):
    torch.manual_seed(shape[0] + shape[1])
    blocks = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    weight = (torch.randn(shape) * 100).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(blocks) * 1e-2 + 1e-4
    config = {**FP8_CONFIG, "weight_block_size": list(block)}
    view = quantized_view(stored(prefixed("model.layers.0.self_attn.q_proj",
                                          {"weight": weight, "weight_scale_inv": scale_inv})), config, "memory")
    ours = view["model.layers.0.self_attn.q_proj.weight"]
    assert ours.format == "fp8-block" and list(ours.shape) == list(shape)
    reference = fp8_reference(weight.float().numpy().astype(np.float64), scale_inv.numpy(), block)
    # one float32 rounding of the exact float64 product
    assert np.array_equal(ours.read().numpy(), reference.astype(np.float32))


def pack_rows(values: np.ndarray, bits: int = 4) -> np.ndarray:
    """GPTQ qweight: 32/bits rows per int32, row k of a word at bits k*bits."""
    per = 32 // bits
    rows = -(-values.shape[0] // per) * per
    padded = np.zeros((rows, values.shape[1]), dtype=np.uint64)
    padded[:values.shape[0]] = values
    words = np.zeros((rows // per, values.shape[1]), dtype=np.uint64)
    for k in range(per):
        words |= padded[k::per] << np.uint64(k * bits)
    return words.astype(np.uint32).view(np.int32)


def pack_columns(values: np.ndarray, order: tuple[int, ...] | None = None, bits: int = 4) -> np.ndarray:
    """qzeros (GPTQ) and AWQ qweight/qzeros: 32/bits columns per int32; AWQ puts column order[k] at field k."""
    per = 32 // bits
    order = order or tuple(range(per))
    cols = -(-values.shape[1] // per) * per
    padded = np.zeros((values.shape[0], cols), dtype=np.uint64)
    padded[:, :values.shape[1]] = values
    words = np.zeros((values.shape[0], cols // per), dtype=np.uint64)
    for k in range(per):
        words |= padded[:, order[k]::per] << np.uint64(k * bits)
    return words.astype(np.uint32).view(np.int32)


@pytest.mark.parametrize(("out", "columns", "group", "act_order", "fmt"), [
    (24, 64, 32, False, "gptq"), (40, 256, 128, False, "gptq"), (8, 96, 32, True, "gptq"),
    (16, 64, -1, False, "gptq"), (24, 64, 32, False, "gptq_v2")])
def test_gptq_equals_reference(out, columns, group, act_order, fmt):
    rng = np.random.default_rng(out * columns)
    groups = 1 if group < 0 else columns // group
    q = rng.integers(0, 16, (columns, out))
    zero = rng.integers(0, 16, (groups, out))
    scales = (rng.random((groups, out)) * 0.02 + 0.001).astype(np.float16)
    g_idx = np.arange(columns) // (columns if group < 0 else group)
    if act_order:
        g_idx = rng.permutation(g_idx)
    stored_zero = (zero - 1) % 16 if fmt == "gptq" else zero  # v1 stores zero - 1
    parts = {"qweight": torch.from_numpy(pack_rows(q)), "qzeros": torch.from_numpy(pack_columns(stored_zero)),
             "scales": torch.from_numpy(scales), "g_idx": torch.from_numpy(g_idx.astype(np.int32))}
    config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": False,
              "checkpoint_format": fmt}
    ours = quantized_view(stored(prefixed("model.layers.1.mlp.down_proj", parts)), config, "m")[
        "model.layers.1.mlp.down_proj.weight"]
    assert ours.format == "gptq-int4" and list(ours.shape) == [out, columns]
    effective = (stored_zero + 1) if fmt == "gptq" else stored_zero  # v1 adds 1 back, without wrapping
    reference = (scales[g_idx].astype(np.float32) * (q - effective[g_idx]).astype(np.float32)).T
    assert np.array_equal(ours.read().numpy(), reference)
    blocked = ours.blocked()
    if act_order:
        assert blocked is None
    else:
        assert np.array_equal(blocked.dequantize().numpy(), reference)


@pytest.mark.parametrize(("out", "columns", "group"), [(16, 64, 32), (40, 256, 128), (8, 128, 64)])
def test_awq_equals_reference(out, columns, group):
    rng = np.random.default_rng(out + columns)
    q = rng.integers(0, 16, (columns, out))
    zero = rng.integers(0, 16, (columns // group, out))
    scales = (rng.random((columns // group, out)) * 0.02 + 0.001).astype(np.float16)
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    parts = {"qweight": torch.from_numpy(pack_columns(q, order)), "qzeros": torch.from_numpy(pack_columns(zero, order)),
             "scales": torch.from_numpy(scales)}
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True}
    ours = quantized_view(stored(prefixed("l.o_proj", parts)), config, "m")["l.o_proj.weight"]
    assert ours.format == "awq-int4" and list(ours.shape) == [out, columns]
    rows = np.arange(columns) // group
    reference = ((q - zero[rows]).astype(np.float32) * scales[rows].astype(np.float32)).T
    assert np.array_equal(ours.read().numpy(), reference)
    assert np.array_equal(ours.blocked().dequantize().numpy(), reference)
