"""Half-precision weights: float16 and bfloat16 DecoderLMs against the float32 transformers reference, at the
per-dtype bars (relative L2 5e-3 float16, 2e-2 bfloat16), through both forms; norms, rotary, softmax and the
AttnRes mixing stay float32 inside. The models use ``initializer_range`` 0.05 (real checkpoints: about 0.02; the
float32 parity tests: 0.1, whose sharper attention roughly doubles the rounding error of a half model, ours and
transformers' alike: docs/models.md#decoderlm-numerics)."""

from __future__ import annotations

import pytest
import torch

from attnres_export.models.decoder import from_hf_folder
from tests.conftest import slow_after
from tests.models.decoder.hf_bodies import (
    empty_past,
    hf_model,
    k3_reference_logits,
    k3_site_weights,
    left_padded,
    relative_l2,
    write_folder,
)

BARS = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
CASES = [("llama", None), ("deepseek_v3", 2), ("deepseek_v3", None), ("qwen3", 1)]


@pytest.fixture(params=slow_after([(case,) for case in CASES]), ids=lambda c: f"{c[0]}-attnres{c[1]}")
def folder(request, tmp_path):
    family, block = request.param
    reference = hf_model(family, seed=21, initializer_range=0.05)
    site = k3_site_weights(reference, seed=21) if block else None
    path = write_folder(reference, tmp_path / family, attn_res=site, attn_res_block_size=block)

    def expected(ids, mask=None, positions=None):
        if site is None:
            return reference(ids, attention_mask=mask, position_ids=positions).logits
        return k3_reference_logits(reference, site, block, ids, mask, positions)

    return path, expected


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@torch.inference_mode()
def test_half_weights_stay_within_the_dtype_bar_of_float32(folder, dtype):
    path, expected = folder
    ours = from_hf_folder(path, dtype=dtype)
    assert ours.lm_head.weight.dtype == dtype
    g = torch.Generator().manual_seed(22)
    for shape in ((1, 1), (2, 13)):
        ids = torch.randint(0, ours.config.vocab_size, shape, generator=g)
        logits = ours(ids)
        assert logits.dtype == torch.float32
        assert relative_l2(logits, expected(ids)) <= BARS[dtype]
    ids, mask, positions = left_padded(torch.randint(1, ours.config.vocab_size, (2, 9), generator=g), [3, 0])
    out = ours.with_past()(ids, mask, positions, empty_past(ours, 2))
    assert all(t.dtype == dtype for t in out[1:])
    valid = mask.bool()
    assert relative_l2(out[0][valid], expected(ids, mask, positions)[valid]) <= BARS[dtype]


@torch.inference_mode()
def test_a_folder_stored_in_bfloat16_loads_in_its_stored_type(tmp_path):
    reference = hf_model("qwen2", seed=23, initializer_range=0.05)
    path = write_folder(reference.to(torch.bfloat16), tmp_path / "bf16")
    ours = from_hf_folder(path)
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, ours.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(24))
    assert relative_l2(ours(ids), reference.float()(ids).logits) <= BARS[torch.bfloat16]


@torch.inference_mode()
def test_a_model_cast_to_float64_computes_in_float64_for_the_parity_reference(tmp_path):
    """``.double()`` widens everything, the float32-kept rotary and AttnRes tensors included, so the exporter's
    float64 reference measures float32's own error (docs/parity.md)."""
    reference = hf_model("deepseek_v3", seed=25)
    path = write_folder(reference, tmp_path / "k3", attn_res=k3_site_weights(reference, seed=25), attn_res_block_size=2)
    single, double = from_hf_folder(path), from_hf_folder(path).double()
    assert double.model.rotary_emb.inv_freq.dtype == double.model.output_attn_res_proj.weight.dtype == torch.float64
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(26))
    exact = double(ids)
    out = double.with_past()(ids, torch.ones_like(ids), torch.arange(9)[None].expand(2, 9), empty_past(double, 2))
    assert exact.dtype == out[0].dtype == out[1].dtype == torch.float64
    assert 0 < relative_l2(single(ids), exact) <= 1e-5
