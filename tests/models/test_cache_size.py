"""The cache-bytes helper of docs/decode.md (``models/cache_size.py``) against counts made by hand from the
published config.json values, one per cache kind: grouped keys and values at ``num_key_value_heads``, DeepSeek-V3's
latent and rope key, Kimi Linear's KDA states (per sequence, the recurrent state float32 in every dtype) beside its
latent layers."""

from __future__ import annotations

import pytest

from attnres_export.errors import CheckpointError
from attnres_export.models.base import CacheInput
from attnres_export.models.cache_size import PUBLISHED, cache_bytes, hf_config_cache

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_grouped_kv_of_llama_3_8b_is_two_times_kv_heads_times_head_dim_per_token(dtype):
    sizes = cache_bytes(hf_config_cache(PUBLISHED["Llama-3-8B"], "Llama-3-8B"), dtype)
    per_layer = 2 * 8 * (4096 // 32) * BYTES[dtype]  # key + value, 8 of 32 heads, head_dim 4096 / 32
    assert sizes.per_token == dict.fromkeys(range(32), per_layer) and sizes.per_sequence == {}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_deepseek_v3_caches_the_latent_and_rope_key_of_61_layers_not_the_mtp_layer(dtype):
    sizes = cache_bytes(hf_config_cache(PUBLISHED["DeepSeek-V3"], "DeepSeek-V3"), dtype)
    assert sizes.per_token == dict.fromkeys(range(61), (512 + 64) * BYTES[dtype]) and sizes.per_sequence == {}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kimi_linear_holds_kda_states_per_sequence_and_latents_per_token(dtype):
    sizes = cache_bytes(hf_config_cache(PUBLISHED["Kimi-Linear-48B-A3B"], "Kimi-Linear-48B-A3B"), dtype)
    mla = [3, 7, 11, 15, 19, 23, 26]  # full_attn_layers [4, 8, ..., 24, 27], counted from 1
    recurrent = 32 * 128 * 128 * 4  # heads x head_dim x head_dim, float32 always
    conv = 3 * (32 * 128) * (4 - 1) * BYTES[dtype]  # q, k, v: the last kernel - 1 inputs of each channel
    assert sizes.per_token == dict.fromkeys(mla, (512 + 64) * BYTES[dtype])
    assert sizes.per_sequence == {i: recurrent + conv for i in range(27) if i not in mla}


def test_a_state_named_outside_the_layer_scheme_is_refused():
    with pytest.raises(CheckpointError, match=r"is not named past_key_values\.LAYER\.NAME"):
        cache_bytes([CacheInput("state", ("batch", "past", 4))], "float32")
