"""``KdaConfig.from_hf`` reads a Kimi Linear config.json as transformers 5.23's ``KimiLinearConfig`` does, and refuses
in one line what the layer does not compute."""

from __future__ import annotations

import pytest
from transformers import KimiLinearConfig

from attnres_export.errors import CheckpointError
from attnres_export.models.kimi import KdaConfig

BASE = {"hidden_size": 64, "num_hidden_layers": 5, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "vocab_size": 16}


@pytest.mark.parametrize("linear", [
    {"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 3, "kda_layers": [1, 2, 3, 5], "full_attn_layers": [4]},
    {"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4, "kda_layers": [2, 4], "full_attn_layers": [1, 3, 5]},
    {},  # transformers' defaults: every fourth layer from index 4 is full attention
], ids=["kimi-linear", "alternating", "defaults"])
def test_sizes_and_1_based_layer_lists_read_as_transformers_reads_them(linear: dict) -> None:
    config = {**BASE, "linear_attn_config": linear}
    ours, theirs = KdaConfig.from_hf(config), KimiLinearConfig(**config)
    assert ours.layer_types == tuple(theirs.layer_types)
    assert (ours.hidden_size, ours.num_heads, ours.head_dim, ours.conv_size, ours.norm_eps) == (
        theirs.hidden_size, theirs.linear_num_heads, theirs.linear_head_dim, theirs.linear_conv_kernel_dim,
        theirs.rms_norm_eps)
    assert ours.kda_layers == tuple(i for i, t in enumerate(theirs.layer_types) if t == "linear_attention")


def test_a_saved_config_with_layer_types_and_flat_keys_reads_the_same() -> None:
    linear = {"head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 3, "kda_layers": [1, 3, 5],
              "full_attn_layers": [2, 4]}
    saved = KimiLinearConfig(**BASE, linear_attn_config=linear).to_dict()
    assert KdaConfig.from_hf(saved) == KdaConfig.from_hf({**BASE, "linear_attn_config": linear})


@pytest.mark.parametrize(("change", "message"), [
    ({"linear_attn_config": {"gate_lower_bound": 5.0}}, "gate_lower_bound: expected a finite number >= -1000 and < 0"),
    ({"linear_attn_config": {"use_full_rank_gate": 1}}, "use_full_rank_gate must be true or false"),
    ({"linear_attn_config": {"gate_upper_bound": 1}}, "linear_attn_config.gate_upper_bound = 1 is not implemented"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not implemented"),
    ({"linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [3, 4, 5]}}, r"in both: \[3\]"),
    ({"linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [4, 5]}}, r"in neither: \[3\]"),
    ({"linear_attn_config": {"kda_layers": [0, 1, 2], "full_attn_layers": [3, 4]}}, r"layer numbers 1..5 \(1-based\)"),
    ({"linear_attn_config": {"kda_layers": [1, 2, 3, 4, 5]}}, "needs both kda_layers and full_attn_layers"),
    ({"layer_types": ["linear_attention"] * 5,
      "linear_attn_config": {"kda_layers": [1, 2, 3, 4], "full_attn_layers": [5]}}, "layer_types disagrees"),
    ({"linear_attn_config": {"head_dim": 0}}, "head_dim: expected a whole number >= 1 and <= 65536"),
])
def test_what_the_layer_does_not_compute_is_refused_in_one_line(change: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message) as info:
        KdaConfig.from_hf({**BASE, **change})
    assert "\n" not in str(info.value)


def test_k3_gate_keys_are_read_and_their_neutral_values_mean_kimi_linear() -> None:
    config = KdaConfig.from_hf({**BASE, "linear_attn_config": {"use_full_rank_gate": False, "gate_lower_bound": None}})
    assert (config.head_dim, config.full_rank_gate, config.gate_lower_bound) == (128, False, None)
    k3 = KdaConfig.from_hf({**BASE, "hidden_act": "situ",
                            "linear_attn_config": {"use_full_rank_gate": True, "gate_lower_bound": -5.0}})
    assert (k3.full_rank_gate, k3.gate_lower_bound, k3.activation) == (True, -5.0, "silu")
