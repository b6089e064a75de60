"""The architecture registry and the model contract: every registered family builds from its own config, satisfies
the contract that the exporter and decoding rely on, and says truthfully what it can do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.errors import CheckpointError
from attnres_export.models.base import ExportableModel, WithPastModel
from attnres_export.models.registry import ARCHITECTURES, architecture, config_from_dict
from attnres_export.ops.opset import AGGREGATE, AGGREGATE_NORM, RESIDUAL_ATTENTION

FAMILIES = sorted(ARCHITECTURES)
TINY = {"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 24, "max_seq_len": 16}


def tiny_config(name: str):
    family = architecture(name)
    if name == "kimi-linear":
        from attnres_export.models.kimi.example import example_config
        from attnres_export.models.kimi.lm_config import KimiLinearConfig

        return KimiLinearConfig.from_hf({"model_type": "kimi_linear", **example_config(2, attn_res_block_size=1)})
    if family.hf_model_types:  # a Hugging Face family: its tiny example folder's config
        from attnres_export.models.decoder.example import example_config
        from attnres_export.models.decoder.hf_config import parse_hf_config

        return parse_hf_config(example_config(family.hf_model_types[0], attn_res_block_size=1))
    return family.config_type()(arch=name, **TINY)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_builds_a_model_that_satisfies_the_export_contract(name):
    from attnres_export.models.example import make_example

    model = make_example(tiny_config(name), seed=0)
    assert isinstance(model, ExportableModel)
    feeds = model.random_inputs(2, 5, np.random.default_rng(0))
    assert set(feeds) == set(model.input_axes)
    with torch.inference_mode(), model.score_weights_folded():
        out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    outputs = (out,) if isinstance(out, torch.Tensor) else out
    assert len(outputs) == len(model.output_names)
    assert outputs[0].shape[:2] == (2, 5)


@pytest.mark.parametrize("name", FAMILIES)
def test_capabilities_say_what_the_model_does(name):
    family = architecture(name)
    from attnres_export.models.example import make_example

    model = make_example(tiny_config(name), seed=0)
    with_past = model.with_past()
    assert (with_past is not None) == family.capabilities.with_past
    if with_past is not None:
        assert isinstance(with_past, WithPastModel)
        assert all(c.name.startswith("past_key_values.") for c in with_past.cache_inputs())
    emitted = {AGGREGATE, AGGREGATE_NORM} if model.aggregation_count() else {RESIDUAL_ATTENTION}
    assert emitted & set(family.capabilities.ops)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_config_round_trips_through_its_plain_values(name):
    cfg = tiny_config(name)
    assert config_from_dict(cfg.to_dict()) == cfg


def test_an_unknown_arch_is_refused_naming_the_known_ones():
    with pytest.raises(CheckpointError, match="known: attnres-lm"):
        architecture("gpt-17")


def test_a_key_of_another_family_is_refused_unless_it_has_the_old_neutral_value():
    values = tiny_config("attnres-lm").to_dict()
    assert config_from_dict(values | {"running_mean": False}) == tiny_config("attnres-lm")
    with pytest.raises(CheckpointError, match="running_mean"):
        config_from_dict(values | {"running_mean": True})
