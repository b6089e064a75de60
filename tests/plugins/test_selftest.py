"""The self-test's CPU-side pieces: case lists, metrics, and the GPU run (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from attnres_export.plugins import selftest, selftest_rsa


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


def test_dry_run_lists_residual_attention_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert selftest.main(["--dry-run", "--op", "rsa"]) == 0
    out = capsys.readouterr().out
    assert "check rsa B=8 H=16 Tq=2048 Tk=2048 dh=128 dv=128 bfloat16 prev=1 mask=keys" in out
    assert "time  rsa B=8 H=16 Tq=2048 Tk=2048 dh=64 dv=64 float16" in out
    assert "Case(n=" not in out, "--op rsa lists no AttnResAggregate case"


def test_residual_attention_cases_cover_the_brief() -> None:
    cases = selftest_rsa.correctness_cases(quick=False)
    assert {c.dtype for c in cases} == set(selftest_rsa.DTYPES)
    assert {32, 64, 72, 80, 96, 128} <= {c.dh for c in cases}
    assert any(c.tq == 1 for c in cases), "decode-like Tq = 1"
    assert any(c.tk % 32 for c in cases), "Tk off the key tile"
    assert {True, False} == {c.prev for c in cases}
    assert set(selftest_rsa.MASK_KINDS) == {c.mask for c in cases}
    assert any(c.divisor != 1.0 for c in cases) and any(c.inplace for c in cases)
    assert any((c.b, c.h, c.tq, c.tk) == (8, 16, 2048, 2048) for c in cases)
    perf = selftest_rsa.performance_cases(quick=False)
    assert {(c.dh, c.dtype) for c in perf} == {(d, t) for d in (64, 128) for t in selftest_rsa.DTYPES}


def test_residual_attention_mask_strides_broadcast() -> None:
    mask = torch.zeros(2, 1, 1, 7)
    assert selftest_rsa.mask_strides(mask) == (7, 0, 0, 1)
    assert selftest_rsa.mask_strides(torch.zeros(2, 3, 5, 7)) == (105, 35, 7, 1)
    assert selftest_rsa.mask_strides(None) == (0, 0, 0, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_selftest_quick_on_gpu() -> None:
    assert selftest.main(["--quick"]) == 0
