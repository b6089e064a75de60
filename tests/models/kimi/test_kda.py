"""``KimiDeltaAttention`` computes what transformers 5.23's ``KimiLinearDeltaAttention`` computes: its prefill (the
chunked form), its multi-token continuation and its single-token decode (the recurrent form, through
transformers' own cache), in float32, float16 and bfloat16; and its state carries across calls exactly."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from safetensors import safe_open
from transformers import DynamicCache, KimiLinearConfig, KimiLinearForCausalLM

from attnres_export.models.kimi import KdaConfig, KimiDeltaAttention
from tests.models.kimi.reference import CONFIG_JSON, hidden, our_layer, rel_l2, transformers_layer

HALF_BARS = {torch.float16: 5e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("tokens", [1, 7, 64, 70, 131])
def test_prefill_from_zero_state_matches_transformers(tokens: int) -> None:
    reference = transformers_layer(seed=tokens)
    x = hidden(2, tokens, seed=tokens)
    with torch.no_grad():
        want = reference(x)
        got, _ = our_layer(reference)(x)
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5


def test_prefill_continuation_and_steps_match_transformers_through_its_cache() -> None:
    """transformers runs prefill, a 5-token continuation (chunked form from the cached state) and three
    decode steps (recurrent form, causal_conv1d_update); our layer carries its own state the same way."""
    reference = transformers_layer(seed=4)
    ours = our_layer(reference)
    cache = DynamicCache(config=KimiLinearConfig(**CONFIG_JSON))
    with torch.no_grad():
        prompt, more = hidden(2, 6, seed=1), hidden(2, 5, seed=2)
        assert rel_l2(ours(prompt)[0], reference(prompt, cache_params=cache)) < 1e-5
        _, state = ours(prompt)
        got, state = ours(more, state)
        assert rel_l2(got, reference(more, cache_params=cache)) < 1e-5
        for seed in range(3):
            token = hidden(2, 1, seed=10 + seed)
            got, state = ours.step(token[:, 0], state)
            assert got.shape == (2, CONFIG_JSON["hidden_size"])
            assert rel_l2(got, reference(token, cache_params=cache)[:, 0]) < 1e-5
    layer = cache.layers[0]
    assert rel_l2(state.recurrent, layer.recurrent_states[0]) < 1e-5
    # transformers keeps the last conv_size inputs of the stacked q|k|v; we keep the conv_size - 1 that are read.
    ours_conv = torch.cat([state.conv_q, state.conv_k, state.conv_v], dim=1)
    torch.testing.assert_close(ours_conv, layer.conv_states[0][..., 1:], rtol=0, atol=0)


@pytest.mark.parametrize("tokens", [1, 3, 9])
def test_state_after_a_prefill_equals_the_state_after_as_many_single_steps(tokens: int) -> None:
    ours = our_layer(transformers_layer(seed=7))
    x = hidden(3, tokens, seed=tokens)
    with torch.no_grad():
        start = ours(hidden(3, 5, seed=99))[1]  # a non-zero state, conv windows full
        prefill, after_prefill = ours(x, start)
        state, outputs = start, []
        for t in range(tokens):
            out, state = ours.step(x[:, t], state)
            outputs.append(out)
    torch.testing.assert_close(torch.stack(outputs, dim=1), prefill, rtol=1e-5, atol=1e-6)
    for name, got, want in zip(state._fields, state, after_prefill, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


def test_short_prefills_keep_the_older_inputs_in_the_conv_state() -> None:
    """A prefill shorter than conv_size - 1 shifts the window: the state's oldest inputs come from the state."""
    ours = our_layer(transformers_layer(seed=8))
    with torch.no_grad():
        _, state = ours(hidden(1, 4, seed=1))
        _, after = ours(hidden(1, 1, seed=2), state)
    torch.testing.assert_close(after.conv_q[..., :-1], state.conv_q[..., 1:], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", list(HALF_BARS), ids=str)
@pytest.mark.parametrize("tokens", [1, 70])
def test_half_precision_weights_match_transformers_in_the_same_dtype(dtype: torch.dtype, tokens: int) -> None:
    reference = transformers_layer(seed=5, dtype=dtype)
    x = hidden(2, tokens, seed=3, dtype=dtype)
    with torch.no_grad():
        want = reference(x)
        got, state = our_layer(reference)(x)
    assert got.dtype == dtype and state.recurrent.dtype == torch.float32 and state.conv_q.dtype == dtype
    assert rel_l2(got, want) < HALF_BARS[dtype]


def test_a_float64_layer_computes_and_carries_float64() -> None:
    """And shows where the float32 error is: ours is within 1e-6 of it, transformers' chunked form further."""
    reference = transformers_layer(seed=131)
    ours = our_layer(reference)
    x = hidden(2, 131, seed=131)
    with torch.no_grad():
        exact, state = our_layer(reference).double()(x.double())
        got, want = ours(x)[0], reference(x)
    assert exact.dtype == state.recurrent.dtype == torch.float64
    assert rel_l2(got, exact) < 1e-6
    assert rel_l2(want, exact) < 1e-5


def test_parameter_names_and_shapes_are_those_of_a_saved_checkpoint_folder() -> None:
    """A folder written by transformers' save_pretrained (Moonshot's layout) loads strictly, without renaming,
    and the layer then computes what the loaded transformers model computes."""
    model = KimiLinearForCausalLM(KimiLinearConfig(**CONFIG_JSON, intermediate_size=16, moe_intermediate_size=8,
                                                   num_attention_heads=2, kv_lora_rank=8, qk_rope_head_dim=4,
                                                   qk_nope_head_dim=4, v_head_dim=4, num_local_experts=2,
                                                   num_experts_per_tok=1))
    attention = model.model.layers[0].self_attn
    with torch.no_grad():  # transformers leaves the gate's A_log and dt_bias uninitialised
        attention.forget_gate.A_log.uniform_(0.0, 2.0)
        attention.forget_gate.dt_bias.uniform_(-1.0, 1.0)
    prefix = "model.layers.0.self_attn."
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            names = [key for key in f.keys() if key.startswith(prefix)]  # noqa: SIM118 (safe_open is no dict)
            tensors = {key.removeprefix(prefix): f.get_tensor(key) for key in names}
    ours = KimiDeltaAttention(KdaConfig.from_hf(CONFIG_JSON))
    ours.load_state_dict(tensors, strict=True)
    x = hidden(1, 5)
    with torch.no_grad():
        assert rel_l2(ours(x)[0], attention(x)) < 1e-5
