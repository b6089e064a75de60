"""Kimi K3 Attention Residuals on decoder bodies, against transformers' layer modules driven by K3's mixing.

The reference (``hf_bodies.k3_reference_logits``) runs the transformers model's own embedding, norms, attention
and MLP modules with K3's block-snapshot mixing restated from NeMo AutoModel's K3 code; the folder holds the
transformers weights plus random non-zero K3 site weights. Block sizes 1 (every layer a block), 2 (a short last
block over 3 layers) and 3 (one block).
"""

from __future__ import annotations

import pytest
import torch

from attnres_export.models.decoder import from_hf_folder
from tests.conftest import slow_after
from tests.models.decoder.hf_bodies import (
    empty_past,
    greedy_with_past,
    hf_model,
    k3_reference_logits,
    k3_site_weights,
    left_padded,
    relative_l2,
    write_folder,
)

BAR = 1e-5
CASES = [("llama", 2), ("deepseek_v3", 2), ("llama", 1), ("qwen3", 3), ("qwen2", 1), ("deepseek_v3", 3)]


@pytest.fixture(params=slow_after([(case,) for case in CASES], fast=2), ids=lambda c: f"{c[0]}-block{c[1]}")
def k3(request, tmp_path):
    family, block = request.param
    reference = hf_model(family, seed=block)
    site = k3_site_weights(reference, seed=block)
    folder = write_folder(reference, tmp_path / family, attn_res=site, attn_res_block_size=block)
    return reference, site, block, from_hf_folder(folder)


@torch.inference_mode()
def test_logits_match_k3_mixing_around_transformers_layers(k3):
    reference, site, block, ours = k3
    g = torch.Generator().manual_seed(4)
    for batch, length in ((1, 1), (2, 9), (1, 17)):
        ids = torch.randint(0, reference.config.vocab_size, (batch, length), generator=g)
        assert relative_l2(ours(ids), k3_reference_logits(reference, site, block, ids)) <= BAR


@torch.inference_mode()
def test_left_padded_batch_with_past_matches_k3_reference(k3):
    reference, site, block, ours = k3
    g = torch.Generator().manual_seed(5)
    ids, mask, positions = left_padded(torch.randint(1, reference.config.vocab_size, (2, 11), generator=g), [4, 0])
    out = ours.with_past()(ids, mask, positions, empty_past(ours, 2))
    expected = k3_reference_logits(reference, site, block, ids, mask, positions)
    valid = mask.bool()
    assert relative_l2(out[0][valid], expected[valid]) <= BAR


@pytest.mark.slow
@torch.inference_mode()
def test_with_past_greedy_tokens_equal_argmax_of_k3_reference(k3):
    """AttnRes carries no state across steps: every token of the cached decode loop is the argmax of a full K3
    forward over the sequence before it (checked in one reference forward over the whole sequence)."""
    reference, site, block, ours = k3
    ids = torch.randint(1, reference.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(6))
    tokens = greedy_with_past(ours, ids, torch.ones_like(ids), 32)
    sequence = torch.cat([ids, tokens], dim=1)
    picks = k3_reference_logits(reference, site, block, sequence[:, :-1])[:, ids.shape[1] - 1:].argmax(-1)
    assert torch.equal(picks, tokens)


@torch.inference_mode()
def test_folded_score_weights_and_fused_norms_give_the_same_logits(k3):
    _, _, _, ours = k3
    ids = torch.randint(0, ours.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(7))
    plain = ours(ids)
    with ours.score_weights_folded():
        folded = ours(ids)
        with ours.norms_fused():
            fused = ours(ids)
    assert torch.equal(folded, plain)
    assert relative_l2(fused, plain) <= 1e-6
