"""config.json is read with transformers' semantics: defaults, both rope spellings, ``null``; the MoE layer rule
agrees with transformers' own choice of layers; every unimplemented key or value is refused in one line naming it."""

from __future__ import annotations

import json

import pytest
import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.decoder import DecoderConfig, DecoderLM, from_hf_folder, parse_hf_config
from attnres_export.models.layers.hf_keys import IRRELEVANT_KEYS
from attnres_export.models.layers.moe import MoEFeedForward
from tests.models.decoder.hf_bodies import FAMILY_SETTINGS, TINY, hf_model, relative_l2, write_folder

REQUIRED = {"vocab_size": 61, "hidden_size": 1024, "intermediate_size": 40, "num_hidden_layers": 3,
            "num_attention_heads": 128}
"""Only the sizes; 128 heads fit every family's default ``num_key_value_heads`` (32, 4, 128, or the heads)."""


def saved_config(family: str, **overrides) -> dict:
    """The config.json transformers writes for a tiny ``family`` model."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(family, **(TINY | FAMILY_SETTINGS[family] | overrides))
    return json.loads(cfg.to_json_string(use_diff=False))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3"])
def test_left_out_keys_take_the_defaults_of_transformers_config_class(family):
    from transformers import AutoConfig

    theirs = AutoConfig.for_model(family, **REQUIRED)
    ours = parse_hf_config({"model_type": family, **REQUIRED})
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    assert ours.num_key_value_heads == theirs.num_key_value_heads
    assert ours.head_dim == getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert ours.rope.rope_theta == theirs.rope_parameters["rope_theta"]
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings
    if family == "deepseek_v3":
        mla = ours.mla
        assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim,
                mla.rope_interleave) == (theirs.q_lora_rank, theirs.kv_lora_rank, theirs.qk_nope_head_dim,
                                         theirs.qk_rope_head_dim, theirs.v_head_dim, theirs.rope_interleave)


def test_null_num_key_value_heads_means_no_grouping_and_the_saved_config_parses_for_every_family():
    assert parse_hf_config(saved_config("llama", num_key_value_heads=None)).num_key_value_heads == 4
    for family in FAMILY_SETTINGS:
        assert parse_hf_config(saved_config(family)).model_type == family


def test_keys_irrelevant_to_inference_are_accepted_whatever_their_value():
    config = saved_config("llama") | {key: "anything" for key in IRRELEVANT_KEYS if key != "model_type"}
    assert parse_hf_config(config) == parse_hf_config(saved_config("llama"))


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 8},
    {"rope_type": "linear", "factor": 2.0},
], ids=lambda s: s["rope_type"])
@torch.inference_mode()
def test_older_top_level_rope_theta_and_rope_scaling_read_as_transformers_reads_them(scaling, tmp_path):
    """A folder written with ``rope_theta`` + ``rope_scaling`` (legacy ``type`` key) parses to the same config as
    the 5.x ``rope_parameters`` spelling and gives the logits transformers gives when it loads that folder."""
    from transformers import AutoModelForCausalLM

    reference = hf_model("llama", seed=31, rope_parameters={"rope_theta": 2000.0, **scaling})
    new_style = write_folder(reference, tmp_path / "new")

    def older(config: dict) -> None:
        params = config.pop("rope_parameters")
        config["rope_theta"] = params.pop("rope_theta")
        params["type"] = params.pop("rope_type")
        config["rope_scaling"] = params

    old_style = write_folder(reference, tmp_path / "old", config_edit=older)
    assert "rope_scaling" in json.loads((old_style / "config.json").read_text())
    ours = from_hf_folder(old_style)
    assert ours.config == from_hf_folder(new_style).config
    theirs = AutoModelForCausalLM.from_pretrained(old_style, attn_implementation="eager").eval()
    ids = torch.randint(0, 61, (2, 40), generator=torch.Generator().manual_seed(32))
    assert relative_l2(ours(ids), theirs(ids).logits) <= 1e-5


def test_rope_scaling_wins_over_rope_parameters_as_in_transformers():
    config = saved_config("llama") | {"rope_scaling": {"rope_type": "linear", "factor": 3.0}}
    rope = parse_hf_config(config).rope
    assert (rope.rope_type, rope.factor, rope.rope_theta) == ("linear", 3.0, 10000.0)


REFUSED = [
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "dynamic"),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
    ("llama", {"rope_parameters": {"rope_type": "mrope"}}, "mrope"),
    ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0, "foo": 1}}, "rope_scaling.foo"),
    ("llama", {"rope_parameters": {"rope_type": "linear"}}, "rope_parameters.factor"),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 0.5}}, "rope_parameters.factor"),
    ("llama", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, "partial_rotary_factor"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("llama", {"original_max_position_embeddings": 64}, "original_max_position_embeddings"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"sliding_window": 4096}, "sliding_window"),
    ("llama", {"num_attention_heads": "4"}, "num_attention_heads"),
    ("llama", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("llama", {"attn_res_block_size": 0}, "attn_res_block_size"),
    ("llama", {"model_type": "mistral"}, "model_type"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen2", {"attention_bias": True}, "attention_bias"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention", "full_attention"]}, "layer_types"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads"),
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func"),
    ("deepseek_v3", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek_v3", {"qk_head_dim": 99}, "qk_head_dim"),
    ("deepseek_v3", {"head_dim": 99}, "head_dim"),
]


@pytest.mark.parametrize(("family", "edit", "named"), REFUSED, ids=[f"{f}-{n}" for f, _, n in REFUSED])
def test_unimplemented_keys_and_values_are_refused_in_one_line_naming_them(family, edit, named):
    config = saved_config(family) | edit
    with pytest.raises(CheckpointError) as caught:
        parse_hf_config(config)
    message = str(caught.value)
    assert named in message
    assert "\n" not in message


def test_a_missing_size_is_refused_by_name():
    config = saved_config("llama")
    del config["hidden_size"]
    with pytest.raises(CheckpointError, match="missing hidden_size"):
        parse_hf_config(config)


@pytest.mark.parametrize(("family", "settings"), [
    ("qwen3_moe", {"mlp_only_layers": [2], "decoder_sparse_step": 2, "num_hidden_layers": 6}),
    ("qwen3_moe", {"mlp_only_layers": [], "decoder_sparse_step": 1}),
    ("deepseek_v3", {"first_k_dense_replace": 1}),
    ("deepseek_v3", {"first_k_dense_replace": 0, "num_hidden_layers": 2}),
])
def test_moe_layers_are_the_layers_transformers_builds_as_moe(family, settings):
    from transformers import AutoModelForCausalLM

    config = saved_config(family, **settings)
    theirs = AutoModelForCausalLM.from_config(_config_object(family, config))
    expected = tuple(i for i, layer in enumerate(theirs.model.layers) if hasattr(layer.mlp, "experts"))
    parsed = parse_hf_config(config)
    assert parsed.moe_layers == expected and expected
    assert parsed.moe.num_experts == 4 and parsed.moe.num_experts_per_tok == 2
    built = DecoderLM(parsed)
    assert tuple(i for i, layer in enumerate(built.model.layers) if isinstance(layer.mlp, MoEFeedForward)) == expected


def _config_object(family: str, config: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(family, **{k: v for k, v in config.items() if k != "model_type"})


@pytest.mark.parametrize("family", list(FAMILY_SETTINGS))
def test_plain_values_round_trip(family):
    cfg = parse_hf_config(saved_config(family, attn_res_block_size=2))
    assert DecoderConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(CheckpointError, match="unknown keys: extra"):
        DecoderConfig.from_dict(cfg.to_dict() | {"extra": 1})
    raw = cfg.to_dict()
    del raw["hidden_size"]
    with pytest.raises(CheckpointError, match="missing keys: hidden_size"):
        DecoderConfig.from_dict(raw)
