"""The self-test's CPU-side pieces: case lists, metrics, and the GPU run (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from attnres.plugins import selftest


def test_cases_cover_every_value_of_the_brief() -> None:
    cases = selftest.correctness_cases(quick=False)
    assert {c.dtype for c in cases} == {"float32", "float16", "bfloat16"}
    assert {64, 1000, 4096, 7168} <= {c.d for c in cases}
    assert {1, 2, 9, 33} <= {c.n for c in cases}
    assert {1, 7, 4096, 16384} <= {c.rows for c in cases}
    assert any(c.misaligned for c in cases)
    assert any(c.d > 16384 for c in cases), "the two-sweep path must be checked"
    decode = [c for c in selftest.performance_cases(quick=True) if c.rows == 1]
    assert {c.n for c in decode} == {2, 9}


def test_bytes_moved_is_the_traffic_floor() -> None:
    assert selftest.Case(9, 16384, 7168, "bfloat16").bytes_moved() == 10 * 16384 * 7168 * 2


def test_metrics_and_bars() -> None:
    ref = torch.randn(1000)
    rel, cos, max_abs = selftest.error_metrics(ref.clone(), ref)
    assert rel == 0.0 and cos == pytest.approx(1.0) and max_abs == 0.0
    noisy = ref + 1e-3 * torch.randn(1000)
    rel, cos, _ = selftest.error_metrics(noisy, ref)
    assert selftest.passes("float16", rel, cos) and not selftest.passes("float32", rel, cos)
    assert not selftest.passes("bfloat16", float("nan"), float("nan"))


def test_dry_run_lists_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert selftest.main(["--dry-run", "--quick"]) == 0
    assert "Case(n=9, rows=1, d=7168" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_selftest_quick_on_gpu() -> None:
    assert selftest.main(["--quick"]) == 0
