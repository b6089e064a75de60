"""Shared fixtures made once per run (small seeded reference checkpoints, one export), the helper that splits a
matrix between the fast loop and the slow tier, and the guard that keeps the fast loop covering every test folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnres_export.models import save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example

# The command line renders tables 160 columns wide writing to no terminal with COLUMNS unset (cli/framework.py);
# pytest-xdist's workers start with COLUMNS=80, which cut long paths out of table cells. Every launcher renders alike.
os.environ["COLUMNS"] = "160"
# Every export in the tests traces its pieces: a trace read from a cache that another run left would test the cache,
# not the code under test (tests/exporter/test_trace_cache.py opts in, with a folder of its own per test).
os.environ["ATTNRES_TRACE_CACHE"] = "off"
# Under the test runner no output is a terminal, so long work would print its progress as lines on stderr
# (cli/progress.py) before a refusal's one line; tests/cli/test_progress.py switches them back on.
os.environ["ATTNRES_PROGRESS"] = "off"

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


@pytest.fixture(scope="session")
def exported_onnx(block2_checkpoint, tmp_path_factory) -> Path:
    """A float16 --target tensorrt export with five AttnResAggregate nodes, batch 1:2:4, seq 1:16:64: made once per
    run and shared by the tests that only read an export (fake TensorRT builds, target conversion)."""
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    out = tmp_path_factory.mktemp("fake-trt") / "m.float16.tensorrt.onnx"
    export_checkpoint(ExportOptions(block2_checkpoint, out, dtype="float16", batch=DimRange(1, 2, 4),
                                    seq=DimRange(1, 16, 64), check=False))
    return out


def slow_after(values, fast: int = 1) -> list:
    """Parameters for a matrix whose first ``fast`` cases run in the fast loop and the rest are marked slow
    (a tuple is one case of several parameters)."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=() if i < fast else pytest.mark.slow)
            for i, v in enumerate(values)]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Keep the fast loop covering every test package by design: a whole-tree run of the default tier fails at
    collection when marking tests slow left a folder of tests without any test in it."""
    tests_root = Path(__file__).parent
    whole_tree = [Path(arg).resolve() for arg in config.args] in ([tests_root], [tests_root.parent])
    if not whole_tree or config.option.markexpr != "not slow":
        return
    folders = {path.parent for path in tests_root.rglob("test_*.py")}
    covered = {Path(item.path).parent for item in items}
    if bare := sorted(str(f.relative_to(tests_root.parent)) for f in folders - covered):
        raise pytest.UsageError(f"the fast loop has no test in {', '.join(bare)}: keep one test there unmarked")
