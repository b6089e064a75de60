"""``read_as`` (the float64 and float32 references of every check) reuses its latest casts: a module that reads
one stacked weight per expert casts it once per call. What is read is still the weight as it is now, in the
asked type: a run through it equals a run of the module cast whole, and a weight changed in place is cast again."""

from __future__ import annotations

import copy

import pytest
import torch

from attnres_export.backends.pytorch.runner import read_as
from attnres_export.models.layers.moe import MoEConfig, MoEFeedForward, SigmoidGroupTopKRouter


def test_a_weight_read_twice_is_cast_once_and_cast_again_once_changed_in_place():
    layer = torch.nn.Linear(5, 3).to(torch.bfloat16)
    with read_as(layer, torch.float64):
        first = layer.weight
        assert layer.weight is first and first.dtype == torch.float64
        with torch.no_grad():
            layer.parametrizations.weight.original.add_(1.0)
        changed = layer.weight
        assert changed is not first
        torch.testing.assert_close(changed, first + 1.0, rtol=0, atol=1e-2)


@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_an_moe_read_as_float64_computes_what_its_float64_copy_computes(tokens, stored):
    torch.manual_seed(tokens)
    moe = MoEFeedForward(MoEConfig(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20), 24,
                         gather_max_tokens=2).to(stored).eval()
    x = torch.randn(1, tokens, 24, dtype=torch.float64)
    wide = copy.deepcopy(moe).double()
    with torch.inference_mode():
        want = wide(x)
        with read_as(moe, torch.float64):
            got = moe(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_non_persistent_buffer_stays_out_of_the_state_dict_after_a_read():
    module = torch.nn.Linear(4, 2)
    module.register_buffer("table", torch.arange(6, dtype=torch.float32), persistent=False)
    before = set(module.state_dict())
    with read_as(module, torch.float64):
        assert module.table.dtype == torch.float64
    assert set(module.state_dict()) == before
    assert module.table.dtype == torch.float32 and "table" in dict(module.named_buffers())


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_a_16_bit_read_leaves_the_tensors_a_16_bit_model_keeps_float32_unrounded(half):
    """The PyTorch run in a 16-bit type that scales a 16-bit artifact's bar reads the model as its export holds
    it: a router's score-correction bias stays float32 (its value unrounded), its weight is read in ``half``."""
    router = SigmoidGroupTopKRouter(MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4,
                                              scoring_func="sigmoid", topk_method="noaux_tc"), 8)
    router.e_score_correction_bias.copy_(torch.tensor([1e-3, 1 + 2 ** -12, -0.3, 0.7]))
    bias = router.e_score_correction_bias.clone()
    with read_as(router, half):
        assert router.weight.dtype == half
        assert router.e_score_correction_bias.dtype == torch.float32
        assert torch.equal(router.e_score_correction_bias, bias)
    with read_as(router, torch.float64):
        assert router.e_score_correction_bias.dtype == torch.float64
