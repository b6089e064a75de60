"""AttnResLM is docs/models.md exactly: checked against an independent NumPy implementation and the gold checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from tests.models import numpy_attnres_lm

SMALL = {"vocab_size": 53, "d_model": 24, "n_heads": 3, "d_ff": 40, "max_seq_len": 32}


def logits_of(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)).double().numpy()


@pytest.mark.parametrize(
    ("residual", "block_size", "n_layers"),
    [("attnres", 0, 2), ("attnres", 1, 2), ("attnres", 2, 3), ("attnres", 4, 3), ("standard", 0, 2)],
)
@pytest.mark.parametrize("seq", [1, 9])
def test_model_matches_independent_numpy_implementation(residual, block_size, n_layers, seq):
    cfg = AttnResLMConfig(**SMALL, n_layers=n_layers, residual=residual, block_size=block_size)
    model = make_example(cfg, seed=5)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, seq))
    sd = {k: v.double().numpy() for k, v in model.state_dict().items()}
    expected = numpy_attnres_lm.forward(sd, cfg.to_dict(), ids)
    got = logits_of(model, ids)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-5


def test_block_size_one_equals_full_attnres_on_the_same_weights():
    full_cfg = AttnResLMConfig(**SMALL, n_layers=3, block_size=0)
    block_cfg = AttnResLMConfig(**SMALL, n_layers=3, block_size=1)
    full = make_example(full_cfg, seed=2)
    block = make_example(block_cfg, seed=99)
    block.load_state_dict(full.state_dict())
    ids = np.random.default_rng(1).integers(0, SMALL["vocab_size"], size=(2, 7))
    np.testing.assert_array_equal(logits_of(full, ids), logits_of(block, ids))


@pytest.mark.parametrize(("block_size", "expected_sources"), [(0, [1, 2, 3, 4, 5, 6, 7]), (4, [1, 2, 2, 2, 2, 3, 3])])
def test_each_sublayer_sees_the_spec_number_of_sources(block_size, expected_sources, monkeypatch):
    cfg = AttnResLMConfig(**SMALL, n_layers=3, block_size=block_size)
    model = make_example(cfg, seed=0)
    seen = []
    import attnres_export.models.attnres_lm as lm

    real = lm.attnres_aggregate
    monkeypatch.setattr(lm, "attnres_aggregate", lambda sw, srcs, eps: seen.append(len(srcs)) or real(sw, srcs, eps))
    logits_of(model, np.zeros((1, 3), dtype=np.int64))
    assert seen == expected_sources
    assert model.aggregation_count() == len(expected_sources)


def test_example_checkpoints_have_random_nonzero_pseudo_queries():
    model = make_example(AttnResLMConfig(**SMALL, n_layers=2), seed=0)
    queries = [p for name, p in model.named_parameters() if name.endswith("_res.query")]
    assert len(queries) == 5
    assert all(q.abs().min() > 0 for q in queries)


def test_half_precision_cast_keeps_aggregation_weights_and_rotary_tables_float32():
    model = make_example(AttnResLMConfig(**SMALL, n_layers=1), seed=0).to(torch.float16)
    assert model.layers[0].attn_res.query.dtype == torch.float32
    assert model.rotary.cos.dtype == torch.float32
    assert model.layers[0].attn.wq.weight.dtype == torch.float16
