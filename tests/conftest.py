"""Shared fixtures: small seeded reference checkpoints, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example

SMALL = {"vocab_size": 97, "d_model": 32, "n_heads": 4, "d_ff": 48, "max_seq_len": 64}


def write_checkpoint(path: Path, seed: int = 0, **overrides) -> Path:
    cfg = AttnResLMConfig(**{**SMALL, **overrides})
    save_checkpoint(make_example(cfg, seed), cfg, path)
    return path


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def block2_checkpoint(checkpoint_dir) -> Path:
    """Block AttnRes, S = 2, two layers: aggregations with 1, 2 and 3 sources."""
    return write_checkpoint(checkpoint_dir / "block2.pt", n_layers=2, block_size=2)


def slow_after(values, fast: int = 1) -> list:
    """Parameters for a matrix whose first ``fast`` cases run in the fast loop and the rest are marked slow
    (a tuple is one case of several parameters)."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=() if i < fast else pytest.mark.slow)
            for i, v in enumerate(values)]
