"""``KimiLinearLM`` loaded from transformers' own saved folders computes transformers' ``KimiLinearForCausalLM``
logits (KDA and NoPE latent attention interleaved, dense and grouped-sigmoid MoE feed-forwards), Kimi K3's
Attention Residuals around transformers' layers, and its with-past form continues a prefill step by step."""

from __future__ import annotations

import pytest
import torch

from attnres_export.errors import CheckpointError
from attnres_export.models import load_checkpoint
from attnres_export.models.base import empty_past
from attnres_export.models.kimi.lm_config import KimiLinearConfig
from tests.models.kimi.lm_reference import TINY, folder_of, hf_model, k3_kimi_reference_logits, relative_l2

TOLERANCE = 1e-5


def ids(batch: int, tokens: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, tokens), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    reference = hf_model(seed=0)
    folder, _ = folder_of(reference, tmp_path_factory.mktemp("kimi") / "tiny")
    ours, _ = load_checkpoint(folder)
    return reference, ours.eval()


@pytest.mark.parametrize("shape", [(1, 1), (2, 7), pytest.param((2, 70), marks=pytest.mark.slow)])
@torch.inference_mode()
def test_logits_match_transformers_kimi_linear(pair, shape):
    reference, ours = pair
    tokens = ids(*shape, seed=sum(shape))
    assert relative_l2(ours(tokens), reference(tokens).logits) <= TOLERANCE


@pytest.mark.parametrize("overrides", [{"q_lora_rank": 16}, {"norm_topk_prob": False, "n_group": 1, "topk_group": 1},
                                       {"tie_word_embeddings": True}, {"head_dim": 72}])
@torch.inference_mode()
def test_query_lora_unnormalised_routing_never_tied_head_and_a_stored_head_dim_match_transformers(tmp_path, overrides):
    """``head_dim`` 72 as Moonshot's Kimi-Linear-48B-A3B config.json stores it (its hidden size over its heads):
    transformers' layers never read it, so the folder computes what transformers computes."""
    reference = hf_model(seed=1, **overrides)
    folder, _ = folder_of(reference, tmp_path / "f")
    ours, _ = load_checkpoint(folder)
    tokens = ids(2, 5, seed=3)
    assert relative_l2(ours.eval()(tokens), reference(tokens).logits) <= TOLERANCE


@torch.inference_mode()
def test_prefill_then_single_steps_equal_one_prefill_and_transformers(pair):
    reference, ours = pair
    wrapper = ours.with_past()
    cache = wrapper.cache_inputs()
    tokens = ids(2, 11, seed=5)
    out = wrapper(tokens[:, :6], torch.ones(2, 6, dtype=torch.int64), torch.arange(6)[None].expand(2, 6),
                  empty_past(cache, 2))
    logits, past = [out[0]], list(out[1:])
    for i in range(6, 11):
        out = wrapper(tokens[:, i:i + 1], torch.ones(2, i + 1, dtype=torch.int64), torch.full((2, 1), i), past)
        logits.append(out[0])
        past = list(out[1:])
    stepped = torch.cat(logits, dim=1)
    assert relative_l2(stepped, ours(tokens)) <= TOLERANCE
    assert relative_l2(stepped, reference(tokens).logits) <= TOLERANCE
    shapes = {c.name: (tuple(p.shape), p.dtype) for c, p in zip(cache, past, strict=True)}
    assert shapes["past_key_values.0.recurrent"] == ((2, 2, 8, 8), torch.float32)
    assert shapes["past_key_values.0.conv_q"] == ((2, 16, 3), torch.float32)
    assert shapes["past_key_values.1.latent"] == ((2, 11, 12), torch.float32)
    assert shapes["past_key_values.1.rope_key"] == ((2, 11, 6), torch.float32)
    assert [c.axes for c in cache[:1]] == [("batch", 2, 8, 8)] and cache[0].dtype == "float32"


@pytest.mark.parametrize("block", [1, 2])
@torch.inference_mode()
def test_attn_res_logits_match_k3_mixing_around_transformers_kimi_layers(tmp_path, block):
    reference = hf_model(seed=2)
    folder, sites = folder_of(reference, tmp_path / "k3", attn_res_block_size=block, seed=4)
    ours, _ = load_checkpoint(folder)
    ours.eval()
    tokens = ids(2, 9, seed=6)
    want = k3_kimi_reference_logits(reference, sites, block, tokens)
    assert relative_l2(ours(tokens), want) <= TOLERANCE
    assert ours.aggregation_count() == 2 * TINY["num_hidden_layers"]
    assert ours.fused_node_count() == 2 * TINY["num_hidden_layers"] + 2  # two KDA layers
    with ours.score_weights_folded(), ours.norms_fused():
        assert relative_l2(ours(tokens), want) <= TOLERANCE
    wrapper = ours.with_past()
    out = wrapper(tokens[:, :5], torch.ones(2, 5, dtype=torch.int64), torch.arange(5)[None].expand(2, 5),
                  empty_past(wrapper.cache_inputs(), 2))
    steps, past = [out[0]], list(out[1:])
    for i in range(5, 9):
        out = wrapper(tokens[:, i:i + 1], torch.ones(2, i + 1, dtype=torch.int64), torch.full((2, 1), i), past)
        steps.append(out[0])
        past = list(out[1:])
    assert relative_l2(torch.cat(steps, dim=1), want) <= TOLERANCE


def saved_config(**edits) -> dict:
    config = {"model_type": "kimi_linear", **TINY}
    return {k: v for k, v in config.items() if k not in edits} | {k: v for k, v in edits.items() if v is not None}


def test_saved_spellings_are_read_as_transformers_attribute_map_reads_them():
    cfg = KimiLinearConfig.from_hf(saved_config(norm_topk_prob=None, moe_renormalize=False, n_group=None,
                                                num_expert_group=1, num_local_experts=None, num_experts=4,
                                                max_position_embeddings=None, model_max_length=99))
    assert (cfg.moe.norm_topk_prob, cfg.moe.n_group, cfg.moe.num_experts, cfg.max_seq_len) == (False, 1, 4, 99)
    assert cfg.layer_types == ("linear_attention", "full_attention") * 2
    assert KimiLinearConfig.from_dict(cfg.to_dict()) == cfg
    assert dict(cfg.features())["KDA layers"].startswith("[0, 2] (2 heads of 8")


@pytest.mark.parametrize(("edits", "message"), [
    ({"sliding_window": 8}, "config key sliding_window not implemented"),
    ({"num_key_value_heads": 1}, "num_key_value_heads 1 != num_attention_heads 2"),
    ({"mla_use_nope": False}, "mla_use_nope = False is not implemented"),
    ({"mlp_layer_types": ["dense"]}, "mlp_layer_types must list 4 values"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not implemented"),
    ({"moe_renormalize": False, "norm_topk_prob": True}, "moe_renormalize and norm_topk_prob are both given"),
])
def test_unimplemented_or_inconsistent_keys_are_refused_in_one_line_naming_them(edits, message):
    with pytest.raises(CheckpointError, match=message) as err:
        KimiLinearConfig.from_hf(saved_config(**edits), where="f/config.json")
    assert str(err.value).startswith("f/config.json: ") and "\n" not in str(err.value)


@torch.inference_mode()
def test_a_left_padded_prefill_and_its_decode_steps_match_transformers_on_the_real_tokens(pair):
    reference, ours = pair
    tokens = ids(2, 9, seed=8)
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[0, :3] = 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    want = reference(tokens, attention_mask=mask, position_ids=positions).logits
    wrapper = ours.with_past()
    out = wrapper(tokens[:, :7], mask[:, :7], positions[:, :7], empty_past(wrapper.cache_inputs(), 2))
    steps, past = [out[0]], list(out[1:])
    for i in (7, 8):
        out = wrapper(tokens[:, i:i + 1], mask[:, :i + 1], positions[:, i:i + 1], past)
        steps.append(out[0])
        past = list(out[1:])
    got = torch.cat(steps, dim=1)
    assert relative_l2(got[1], want[1]) <= TOLERANCE
    assert relative_l2(got[0, 3:], want[0, 3:]) <= TOLERANCE
