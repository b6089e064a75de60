"""DecoderLM computes what transformers computes, family by family, from a folder transformers wrote.

Each case builds the transformers model at random init (norm gains and biases random too), saves it with
``save_pretrained``, loads it with ``from_hf_folder`` and compares float32 logits (relative L2 <= 1e-5) for a
single token and odd lengths, a left-padded batch through the with-past form (prefill, then decode steps against
transformers' own KV cache), and 32 greedy tokens of the with-past loop against ``generate``.
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
    left_padded,
    relative_l2,
    write_folder,
)

BAR = 1e-5
LLAMA3 = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
CASES = [
    ("llama", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("qwen3_moe", {}),
    ("deepseek_v3", {}),
    ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True, "num_key_value_heads": None,
               "rope_parameters": LLAMA3}),
    ("llama", {"num_key_value_heads": 1, "head_dim": 6, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                               "rope_theta": 500.0}}),
    ("qwen2", {"tie_word_embeddings": True, "rope_parameters": YARN | {"beta_fast": 16, "beta_slow": 2,
                                                                         "attention_factor": 1.2, "truncate": False}}),
    ("qwen3", {"attention_bias": True, "num_key_value_heads": 4, "rope_parameters": YARN}),
    ("deepseek_v3", {"q_lora_rank": None, "rope_interleave": False, "attention_bias": True,
                     "rope_parameters": YARN | {"mscale": 0.7, "mscale_all_dim": 1.0}}),
    ("deepseek_v3", {"rope_parameters": YARN | {"mscale": 1.0, "mscale_all_dim": 0.8}}),
]
IDS = [f"{family}-{i}" for i, (family, _) in enumerate(CASES)]


def _params():
    """One case per family in the fast loop; the rope, bias and tying variants are slow."""
    marked = slow_after([(case,) for case in CASES], fast=5)
    return [pytest.param(*p.values, marks=p.marks, id=name) for p, name in zip(marked, IDS, strict=True)]


@pytest.fixture(params=_params())
def pair(request, tmp_path):
    family, overrides = request.param
    reference = hf_model(family, seed=len(overrides), **overrides)
    return reference, from_hf_folder(write_folder(reference, tmp_path / family))


@torch.inference_mode()
def test_logits_match_transformers_for_one_token_and_odd_lengths(pair):
    reference, ours = pair
    g = torch.Generator().manual_seed(1)
    for batch, length in ((1, 1), (2, 7), (3, 19)):
        ids = torch.randint(0, reference.config.vocab_size, (batch, length), generator=g)
        assert relative_l2(ours(ids), reference(ids).logits) <= BAR


@torch.inference_mode()
def test_left_padded_prefill_and_decode_steps_match_transformers_cache(pair):
    reference, ours = pair
    g = torch.Generator().manual_seed(2)
    ids, mask, positions = left_padded(torch.randint(1, reference.config.vocab_size, (3, 9), generator=g), [0, 3, 8])
    step = ours.with_past()
    out = step(ids, mask, positions, empty_past(ours, 3))
    expected = reference(ids, attention_mask=mask, position_ids=positions, use_cache=True)
    valid = mask.bool()
    assert relative_l2(out[0][valid], expected.logits[valid]) <= BAR
    cache = expected.past_key_values
    for new_tokens in (1, 3):
        ids = torch.randint(1, reference.config.vocab_size, (3, new_tokens), generator=g)
        positions = positions[:, -1:] + torch.arange(1, new_tokens + 1)
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
        out = step(ids, mask, positions, list(out[1:]))
        expected = reference(ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        cache = expected.past_key_values
        assert relative_l2(out[0], expected.logits) <= BAR


@pytest.mark.slow
@torch.inference_mode()
def test_with_past_greedy_tokens_equal_transformers_generate(pair):
    reference, ours = pair
    g = torch.Generator().manual_seed(3)
    ids, mask, _ = left_padded(torch.randint(1, reference.config.vocab_size, (2, 6), generator=g), [0, 2])
    expected = reference.generate(ids, attention_mask=mask, max_new_tokens=33, do_sample=False)[:, ids.shape[1]:]
    assert torch.equal(greedy_with_past(ours, ids, mask, 33), expected)
