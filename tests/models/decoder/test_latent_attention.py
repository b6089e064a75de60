"""Latent attention over a cache in its two forms (models/layers/latent_attention.py): each equals an independent
float64 NumPy MLA at every dtype, the choice between them follows the multiply-add counts, and a with-past export
holds both behind an ``If`` on the query count, so that a prefill longer than the threshold (the expanded form) and
the decode steps after it (the absorbed form) both give transformers' logits on ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch

from attnres_export.dims import DimRange
from attnres_export.exporter.with_past import export_with_past, with_past_ranges
from attnres_export.models.base import empty_past, step_input_axes
from attnres_export.models.decoder import from_hf_folder
from attnres_export.models.layers.latent_attention import absorbed_form, absorbed_max_queries, expanded_form
from tests.models.decoder.hf_bodies import hf_model, write_folder

HEADS, NOPE, SHARED, V_DIM, RANK = 3, 8, 6, 10, 12
BARS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def numpy_mla(q, latent, k_shared, weight, allowed, scale) -> np.ndarray:
    """transformers' MLA in float64: every cached position expanded by ``kv_b_proj``, then masked softmax."""
    q, latent, k_shared, weight = (np.asarray(t, np.float64) for t in (q, latent, k_shared, weight))
    b, s = latent.shape[:2]
    kv = (latent @ weight.T).reshape(b, s, HEADS, NOPE + V_DIM).transpose(0, 2, 1, 3)
    k = np.concatenate([kv[..., :NOPE], np.broadcast_to(k_shared[:, None], (b, HEADS, s, SHARED))], axis=-1)
    scores = np.where(allowed, q @ k.transpose(0, 1, 3, 2) * scale, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ kv[..., NOPE:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("batch", "queries", "past"), [(1, 1, 0), (2, 1, 7), (3, 5, 4), (1, 13, 0)])
def test_absorbed_and_expanded_forms_equal_a_float64_numpy_mla_at_every_dtype(dtype, batch, queries, past):
    g = torch.Generator().manual_seed(queries * 31 + past)
    s = past + queries
    q = torch.randn(batch, HEADS, queries, NOPE + SHARED, generator=g).to(dtype)
    latent = torch.randn(batch, s, RANK, generator=g).to(dtype)
    k_shared = torch.randn(batch, s, SHARED, generator=g).to(dtype)
    weight = (0.3 * torch.randn(HEADS * (NOPE + V_DIM), RANK, generator=g)).to(dtype)
    allowed = torch.ones(queries, s, dtype=torch.bool).tril(past)[None, None].expand(batch, 1, queries, s).clone()
    allowed[0, :, :, 0] = False  # a padded first position in one row
    allowed[0, :, :, -1] = True
    scale = (NOPE + SHARED) ** -0.5
    want = numpy_mla(*(t.float() for t in (q, latent, k_shared, weight)), allowed.numpy(), scale)
    for form in (absorbed_form, expanded_form):
        got = form(NOPE, V_DIM, scale)(q, latent, k_shared, weight, allowed)
        assert got.dtype == torch.float32 and got.shape == (batch, HEADS, queries, V_DIM)
        error = np.linalg.norm(got.double().numpy() - want) / np.linalg.norm(want)
        assert error < BARS[dtype], (form.__name__, error)


def test_the_absorbed_form_is_chosen_while_it_costs_fewer_multiply_adds():
    assert absorbed_max_queries(512, 128, 128) == 170  # DeepSeek-V3's and Kimi Linear's widths
    assert absorbed_max_queries(128, 64, 64) == 128  # benchmarks/family_decode.py's
    assert absorbed_max_queries(RANK, NOPE, V_DIM) == 36
    assert absorbed_max_queries(16, 16, 16) == 2**31 - 1  # never dearer


@pytest.mark.slow
@torch.inference_mode()
def test_a_prefill_past_the_threshold_and_its_decode_steps_give_transformers_logits_on_onnx_runtime(tmp_path):
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner

    reference = hf_model("deepseek_v3", seed=61, num_hidden_layers=2, kv_lora_rank=RANK, qk_nope_head_dim=NOPE,
                         v_head_dim=V_DIM)
    model = from_hf_folder(write_folder(reference, tmp_path / "deepseek"))
    ranges = with_past_ranges(DimRange(1, 2, 2), DimRange(1, 4, 48), DimRange(0, 4, 64), 96)
    onnx_model, step = export_with_past(model, ranges, "float32", 18, seed=0)
    proto = ir.serde.serialize_model(onnx_model)
    assert [n.op_type for n in proto.graph.node].count("If") == 2  # one per latent-attention layer
    cache = step.cache_inputs()
    names = list(step_input_axes(cache))
    ids = torch.randint(1, 61, (2, 40), generator=torch.Generator().manual_seed(62))  # 40 > 36 queries: expanded
    mask, positions = torch.ones_like(ids), torch.arange(40).expand(2, 40)
    with OnnxRuntimeRunner(proto) as runner:
        got = runner.infer(dict(zip(names, [t.numpy() for t in (ids, mask, positions, *empty_past(cache, 2))],
                                    strict=True)))
        want = reference(ids).logits
        np.testing.assert_allclose(got["logits"], want.numpy(), rtol=1e-4, atol=1e-5)
        for _ in range(3):  # single queries: absorbed
            token = torch.from_numpy(got["logits"][:, -1:].argmax(-1))
            ids, mask, positions = torch.cat([ids, token], 1), torch.cat([mask, torch.ones_like(token)], 1), \
                positions[:, -1:] + 1
            got = runner.infer(dict(zip(names, [t.numpy() for t in (token, mask, positions)]
                                        + [got[c.present] for c in cache], strict=True)))
            np.testing.assert_allclose(got["logits"][:, -1], reference(ids).logits[:, -1].numpy(), rtol=1e-4,
                                       atol=1e-5)
