"""The self-test's CPU-side pieces: case lists, metrics, and the GPU run (skipped without a GPU)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from attnres_export.plugins import selftest, selftest_aggregate_norm, selftest_common, selftest_rsa


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


def test_aggregate_norm_cases_cover_the_brief() -> None:
    for quick in (False, True):
        cases = selftest_aggregate_norm.correctness_cases(quick)
        assert {c.dtype for c in cases} == set(selftest_common.DTYPES)
        assert {7, 64, 1000, 1001, 7168} <= {c.d for c in cases}, "odd D, D off the 16-byte pack, decode-like D"
        assert {1, 3, 9, 33} <= {c.n for c in cases}
        assert any(c.rows == 1 and c.d == 7168 for c in cases), "a single decode-like row"
        assert any(c.rows > 2**20 for c in cases), "more rows than the RMSNorm grid: blocks take several rows"
        assert any(c.misaligned for c in cases)
    assert any(c.d > 16384 for c in selftest_aggregate_norm.correctness_cases(False)), "the aggregate's two-sweep path"


def test_dry_run_lists_aggregate_norm_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert selftest.main(["--dry-run", "--op", "aggregate_norm"]) == 0
    out = capsys.readouterr().out
    assert "check aggregate_norm n=33 rows=1 D=7168 bfloat16" in out
    assert "check aggregate_norm n=3 rows=7 D=1000 float16 misaligned" in out
    assert "Case(n=" not in out and "check rsa" not in out and "time " not in out, "correctness only"
    assert selftest.main(["--dry-run", "--quick"]) == 0
    assert "check aggregate_norm" in capsys.readouterr().out, "--op all includes it"


def test_aggregate_norm_gold_values_are_the_reference() -> None:
    """The gold constants of the self-test are what the PyTorch reference gives (CPU, float32)."""
    sw = torch.tensor([2.0, 0.0, 0.0, 0.0])
    nw = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sources = [torch.tensor([[1.0, 0, 0, 0]]), torch.tensor([[0.0, 1, 0, 0]])]
    y, h = selftest_aggregate_norm.attnres_aggregate_norm_reference(sw, nw, sources, 0.0, 0.0)
    assert torch.allclose(h, torch.tensor([selftest_aggregate_norm.GOLD_H]), atol=1e-6)
    assert torch.allclose(y, torch.tensor([selftest_aggregate_norm.GOLD_Y]), atol=2e-6)


@pytest.mark.parametrize("dtype", list(selftest_common.DTYPES))
def test_aggregate_norm_compare_passes_the_reference_and_fails_what_is_wrong(dtype: str) -> None:
    """compare() on CPU tensors: the reference passes itself; an unwritten element, a y that is not the norm of
    the kernel's own h, and a wrong h each fail."""
    generator = torch.Generator().manual_seed(0)
    case = selftest_aggregate_norm.NormCase(3, 5, 1001, dtype)
    sw, nw = selftest_aggregate_norm.make_weights(case.d, generator, device="cpu")
    sources = selftest_common.random_sources(case.n, case.rows, case.d, dtype, False, generator, device="cpu")
    ref_y, ref_h = selftest_aggregate_norm.attnres_aggregate_norm_reference(
        sw, nw, sources, selftest_aggregate_norm.EPS, selftest_aggregate_norm.NORM_EPS)
    assert ref_y.dtype == ref_h.dtype == selftest_common.DTYPES[dtype][0]
    own = selftest_aggregate_norm.rms_norm_reference(ref_h, nw, selftest_aggregate_norm.NORM_EPS)
    good = selftest_aggregate_norm.compare(case, ref_y, ref_h, ref_y, ref_h, own)
    assert good["ok"] and good["op"] == "AttnResAggregateNorm" and good["y_unwritten"] == 0
    assert good["y_own_h_rel_l2"] == 0.0
    unwritten = ref_y.clone()
    unwritten[2, 7] = float("nan")
    assert not selftest_aggregate_norm.compare(case, unwritten, ref_h, ref_y, ref_h, own)["ok"]
    assert not selftest_aggregate_norm.compare(case, 1.5 * ref_y, ref_h, ref_y, ref_h, own)["ok"]
    assert not selftest_aggregate_norm.compare(case, ref_y, -ref_h, ref_y, ref_h, own)["ok"]


def test_every_table_title_names_the_gpu() -> None:
    gpu = selftest_common.gpu_label((9, 0), "NVIDIA H200")
    assert gpu == "sm_90 (NVIDIA H200)"
    results = [
        {"op": "AttnResAggregate", "check": "gold D=4", "ok": True},
        {"op": "AttnResAggregate", "dtype": "bfloat16", "rel_l2": 3e-3, "ok": True},
        {"op": "AttnResAggregateNorm", "dtype": "float16", "y_rel_l2": 1e-4, "h_rel_l2": 2e-4, "ok": True},
        {"op": "AttnResAggregateNorm", "dtype": "float16", "y_rel_l2": float("nan"), "ok": False},
    ]
    table = selftest_common.correctness_table(results, gpu)
    assert "sm_90 (NVIDIA H200)" in str(table.title)
    assert table.row_count == 3
    assert selftest_common.worst_rel_l2(results[2]) == 2e-4
    assert selftest_common.worst_rel_l2(results[0]) is None
    timing = {"n": 9, "rows": 1, "d": 7168, "dtype": "bfloat16", "kernel_us": 5.0, "kernel_gbps": 100.0,
              "fraction_of_copy": 0.5, "speedup_vs_eager": 3.0}
    assert "sm_90 (NVIDIA H200)" in str(selftest._perf_table([timing], gpu).title)
    rsa = {**asdict(selftest_rsa.performance_cases(quick=True)[0]), "kernel_us": 1e3, "kernel_tflops": 1.0,
           "eager_us": 2e3, "speedup_vs_eager": 2.0, "sdpa_us": 5e2}
    assert "sm_90 (NVIDIA H200)" in str(selftest_rsa.perf_table([rsa], gpu).title)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_selftest_quick_on_gpu() -> None:
    assert selftest.main(["--quick"]) == 0
