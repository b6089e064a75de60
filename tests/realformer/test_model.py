"""The reference RealFormer computes docs/models.md#realformer: checked against an independent NumPy implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.models.example import make_example
from attnres_export.models.realformer.model import MASK_BIAS, RealFormer, padding_bias
from tests.realformer.conftest import realformer_config
from tests.realformer.numpy_realformer import realformer_numpy


def _run(model: RealFormer, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    with torch.inference_mode():
        hidden, carried = model.forward_with_scores(*(torch.from_numpy(feeds[k])
                                                      for k in ("input_ids", "attention_mask")))
    return hidden.numpy(), [r.numpy() for r in carried]


def _numpy(model: RealFormer, feeds: dict[str, np.ndarray], carry_masked: bool = False):
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    return realformer_numpy(state, model.config.to_dict(), feeds["input_ids"], feeds["attention_mask"],
                            carry_masked)


@pytest.mark.parametrize("running_mean", [False, True])
def test_forward_matches_independent_numpy_with_padding(running_mean: bool) -> None:
    model = make_example(realformer_config(running_mean=running_mean, n_layers=3), seed=1)
    feeds = model.random_inputs(3, 12, np.random.default_rng(0))
    assert (feeds["attention_mask"] == 0).any(), "the inputs must contain padding"
    hidden, carried = _run(model, feeds)
    ref_hidden, ref_carried = _numpy(model, feeds)
    np.testing.assert_allclose(hidden, ref_hidden, rtol=1e-4, atol=2e-5)
    for got, ref in zip(carried, ref_carried, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_running_mean_changes_the_output_only_from_the_second_layer() -> None:
    plain = make_example(realformer_config(running_mean=False), seed=2)
    mean = make_example(realformer_config(running_mean=True), seed=2)
    feeds = plain.random_inputs(2, 8, np.random.default_rng(1))
    (h_plain, r_plain), (h_mean, r_mean) = _run(plain, feeds), _run(mean, feeds)
    np.testing.assert_array_equal(r_plain[0], r_mean[0])
    assert not np.allclose(h_plain, h_mean, atol=1e-3)


def test_carried_scores_are_pre_mask() -> None:
    """Padding enters each layer's logits but never the carried running sum R_l."""
    model = make_example(realformer_config(), seed=4)
    feeds = model.random_inputs(2, 10, np.random.default_rng(2))
    unpadded = {**feeds, "attention_mask": np.ones_like(feeds["attention_mask"])}
    _, carried = _run(model, feeds)
    _, carried_unpadded = _run(model, unpadded)
    np.testing.assert_allclose(carried[0], carried_unpadded[0], rtol=1e-6, atol=1e-6)
    assert np.abs(np.concatenate([r.ravel() for r in carried])).max() < 100.0
    _, leaky = _numpy(model, feeds, carry_masked=True)
    assert not np.allclose(carried[1], leaky[1], atol=1.0), "the leaky reference must differ, or the test is blind"


def test_padding_keys_get_exactly_minus_10000_in_float32() -> None:
    bias = padding_bias(torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert bias.dtype == torch.float32 and bias.shape == (2, 1, 1, 3)
    assert bias.flatten().tolist() == [0.0, 0.0, MASK_BIAS, 0.0, MASK_BIAS, MASK_BIAS]
    assert MASK_BIAS == -10000.0


def test_padded_keys_do_not_change_real_tokens() -> None:
    """Extra padding tokens (any ids) leave the hidden states of the real tokens unchanged."""
    model = make_example(realformer_config(), seed=5)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, size=(1, 6))
    short = {"input_ids": ids, "attention_mask": np.ones((1, 6), dtype=np.int64)}
    padded = {"input_ids": np.concatenate([ids, rng.integers(0, 50, size=(1, 4))], axis=1),
              "attention_mask": np.concatenate([np.ones((1, 6)), np.zeros((1, 4))], axis=1).astype(np.int64)}
    np.testing.assert_allclose(_run(model, padded)[0][:, :6], _run(model, short)[0], rtol=1e-5, atol=1e-5)


def test_state_dict_keys_are_the_spec_format() -> None:
    keys = set(RealFormer(realformer_config(n_layers=1)).state_dict())
    expected = {"embed.tok.weight", "embed.pos.weight", "embed.norm.weight", "embed.norm.bias"}
    expected |= {f"layers.0.attn.{p}.{t}" for p in ("wq", "wk", "wv", "wo") for t in ("weight", "bias")}
    expected |= {f"layers.0.{n}.{t}" for n in ("attn_norm", "ffn_norm", "ffn.w1", "ffn.w2") for t in ("weight", "bias")}
    assert keys == expected


def test_random_inputs_pad_some_rows_and_keep_a_real_token_in_every_row() -> None:
    model = RealFormer(realformer_config())
    for batch, seq in [(1, 8), (2, 8), (5, 16), (4, 1)]:
        feeds = model.random_inputs(batch, seq, np.random.default_rng(batch * seq))
        mask = feeds["attention_mask"]
        assert mask.dtype == np.int64 and feeds["input_ids"].dtype == np.int64
        assert (mask[:, 0] == 1).all()
        assert (np.diff(mask, axis=1) <= 0).all(), "padding only at the end of a row"
        assert (mask == 0).any() == (seq > 1)


def test_one_fused_node_per_layer_and_float32_output_in_half_precision() -> None:
    model = make_example(realformer_config(n_layers=3), seed=0)
    assert model.fused_node_count() == 3
    feeds = {k: torch.from_numpy(v) for k, v in model.random_inputs(2, 5, np.random.default_rng(0)).items()}
    with torch.inference_mode():
        ref = model(**feeds)
        half = model.to(torch.float16)(**feeds)
    assert half.dtype == torch.float32 and ref.shape == (2, 5, 32)
    assert torch.nn.functional.cosine_similarity(half.flatten(), ref.flatten(), dim=0) > 0.999
