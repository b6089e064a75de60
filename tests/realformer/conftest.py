"""Tiny RealFormer configs and checkpoints shared by the RealFormer tests."""

from __future__ import annotations

import pytest

from attnres_export.models import save_checkpoint
from attnres_export.models.example import make_example
from attnres_export.models.realformer import RealFormerConfig


def realformer_config(running_mean: bool = False, **overrides) -> RealFormerConfig:
    values = {"vocab_size": 50, "d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "eps": 1e-12,
              "max_seq_len": 16, "running_mean": running_mean} | overrides
    return RealFormerConfig(**values)


@pytest.fixture(scope="session")
def realformer_checkpoint(tmp_path_factory):
    """A running-mean RealFormer checkpoint (the divisor attribute is then not 1 in layer 1)."""
    cfg = realformer_config(running_mean=True)
    path = tmp_path_factory.mktemp("realformer") / "realformer.pt"
    save_checkpoint(make_example(cfg, seed=3), cfg, path)
    return path
