"""Tiny RealFormer configs and checkpoints shared by the RealFormer tests."""

from __future__ import annotations

import pytest

from attnres_export.models import ModelConfig, save_checkpoint
from attnres_export.models.example import make_example


def realformer_config(running_mean: bool = False, **overrides) -> ModelConfig:
    values = {"arch": "realformer", "vocab_size": 50, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64,
              "residual": "standard", "block_size": 0, "eps": 1e-12, "max_seq_len": 16,
              "running_mean": running_mean} | overrides
    return ModelConfig(**values)


@pytest.fixture(scope="session")
def realformer_checkpoint(tmp_path_factory):
    """A running-mean RealFormer checkpoint (the divisor attribute is then not 1 in layer 1)."""
    cfg = realformer_config(running_mean=True)
    path = tmp_path_factory.mktemp("realformer") / "realformer.pt"
    save_checkpoint(make_example(cfg, seed=3), cfg, path)
    return path
