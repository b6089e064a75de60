"""The self-test's CPU-side pieces: case lists, metrics, tables, the entry point, and the GPU run (skipped without
a GPU)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from attnres_export.plugins.selftest import aggregate, aggregate_norm, common, rsa, run
from attnres_export.plugins.selftest.table import render_text, table

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_cases_cover_every_value_of_the_brief() -> None:
    cases = aggregate.correctness_cases(quick=False)
    assert {c.dtype for c in cases} == {"float32", "float16", "bfloat16"}
    assert {64, 1000, 4096, 7168} <= {c.d for c in cases}
    assert {1, 2, 9, 33} <= {c.n for c in cases}
    assert {1, 7, 4096, 16384} <= {c.rows for c in cases}
    assert any(c.misaligned for c in cases)
    assert any(c.d > 16384 for c in cases), "the two-sweep path must be checked"
    decode = [c for c in aggregate.performance_cases(quick=True) if c.rows == 1]
    assert {c.n for c in decode} == {2, 9}


def test_bytes_moved_is_the_traffic_floor() -> None:
    assert aggregate.Case(9, 16384, 7168, "bfloat16").bytes_moved() == 10 * 16384 * 7168 * 2


def test_metrics_and_bars() -> None:
    ref = torch.randn(1000)
    rel, cos, max_abs = common.error_metrics(ref.clone(), ref)
    assert rel == 0.0 and cos == pytest.approx(1.0) and max_abs == 0.0
    noisy = ref + 1e-3 * torch.randn(1000)
    rel, cos, _ = common.error_metrics(noisy, ref)
    assert common.passes("float16", rel, cos) and not common.passes("float32", rel, cos)
    assert not common.passes("bfloat16", float("nan"), float("nan"))


def test_dry_run_lists_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--dry-run", "--quick"]) == 0
    assert "Case(n=9, rows=1, d=7168" in capsys.readouterr().out


def test_dry_run_lists_residual_attention_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--dry-run", "--op", "rsa"]) == 0
    out = capsys.readouterr().out
    assert "check rsa B=8 H=16 Tq=2048 Tk=2048 dh=128 dv=128 bfloat16 prev=1 mask=keys" in out
    assert "time  rsa B=8 H=16 Tq=2048 Tk=2048 dh=64 dv=64 float16" in out
    assert "Case(n=" not in out, "--op rsa lists no AttnResAggregate case"


def test_residual_attention_cases_cover_the_brief() -> None:
    cases = rsa.correctness_cases(quick=False)
    assert {c.dtype for c in cases} == set(rsa.DTYPES)
    assert {32, 64, 72, 80, 96, 128} <= {c.dh for c in cases}
    assert any(c.tq == 1 for c in cases), "decode-like Tq = 1"
    assert any(c.tk % 32 for c in cases), "Tk off the key tile"
    assert {True, False} == {c.prev for c in cases}
    assert set(rsa.MASK_KINDS) == {c.mask for c in cases}
    assert any(c.divisor != 1.0 for c in cases) and any(c.inplace for c in cases)
    assert any((c.b, c.h, c.tq, c.tk) == (8, 16, 2048, 2048) for c in cases)
    perf = rsa.performance_cases(quick=False)
    assert {(c.dh, c.dtype) for c in perf} == {(d, t) for d in (64, 128) for t in rsa.DTYPES}


def test_residual_attention_mask_strides_broadcast() -> None:
    mask = torch.zeros(2, 1, 1, 7)
    assert rsa.mask_strides(mask) == (7, 0, 0, 1)
    assert rsa.mask_strides(torch.zeros(2, 3, 5, 7)) == (105, 35, 7, 1)
    assert rsa.mask_strides(None) == (0, 0, 0, 0)


def test_aggregate_norm_cases_cover_the_brief() -> None:
    for quick in (False, True):
        cases = aggregate_norm.correctness_cases(quick)
        assert {c.dtype for c in cases} == set(common.DTYPES)
        assert {7, 64, 1000, 1001, 7168} <= {c.d for c in cases}, "odd D, D off the 16-byte pack, decode-like D"
        assert {1, 3, 9, 33} <= {c.n for c in cases}
        assert any(c.rows == 1 and c.d == 7168 for c in cases), "a single decode-like row"
        assert any(c.rows > 2**20 for c in cases), "more rows than the RMSNorm grid: blocks take several rows"
        assert any(c.misaligned for c in cases)
    assert any(c.d > 16384 for c in aggregate_norm.correctness_cases(False)), "the aggregate's two-sweep path"


def test_dry_run_lists_aggregate_norm_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--dry-run", "--op", "aggregate_norm"]) == 0
    out = capsys.readouterr().out
    assert "check aggregate_norm n=33 rows=1 D=7168 bfloat16" in out
    assert "check aggregate_norm n=3 rows=7 D=1000 float16 misaligned" in out
    assert "Case(n=" not in out and "check rsa" not in out and "time " not in out, "correctness only"
    assert run.main(["--dry-run", "--quick"]) == 0
    assert "check aggregate_norm" in capsys.readouterr().out, "--op all includes it"


def test_aggregate_norm_gold_values_are_the_reference() -> None:
    """The gold constants of the self-test are what the PyTorch reference gives (CPU, float32)."""
    sw = torch.tensor([2.0, 0.0, 0.0, 0.0])
    nw = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sources = [torch.tensor([[1.0, 0, 0, 0]]), torch.tensor([[0.0, 1, 0, 0]])]
    y, h = aggregate_norm.attnres_aggregate_norm_reference(sw, nw, sources, 0.0, 0.0)
    assert torch.allclose(h, torch.tensor([aggregate_norm.GOLD_H]), atol=1e-6)
    assert torch.allclose(y, torch.tensor([aggregate_norm.GOLD_Y]), atol=2e-6)


@pytest.mark.parametrize("dtype", list(common.DTYPES))
def test_aggregate_norm_compare_passes_the_reference_and_fails_what_is_wrong(dtype: str) -> None:
    """compare() on CPU tensors: the reference passes itself; an unwritten element, a y that is not the norm of
    the kernel's own h, and a wrong h each fail."""
    generator = torch.Generator().manual_seed(0)
    case = aggregate_norm.NormCase(3, 5, 1001, dtype)
    sw, nw = aggregate_norm.make_weights(case.d, generator, device="cpu")
    sources = common.random_sources(case.n, case.rows, case.d, dtype, False, generator, device="cpu")
    ref_y, ref_h = aggregate_norm.attnres_aggregate_norm_reference(
        sw, nw, sources, aggregate_norm.EPS, aggregate_norm.NORM_EPS)
    assert ref_y.dtype == ref_h.dtype == common.DTYPES[dtype][0]
    own = aggregate_norm.rms_norm_reference(ref_h, nw, aggregate_norm.NORM_EPS)
    good = aggregate_norm.compare(case, ref_y, ref_h, ref_y, ref_h, own)
    assert good["ok"] and good["op"] == "AttnResAggregateNorm" and good["y_unwritten"] == 0
    assert good["y_own_h_rel_l2"] == 0.0
    unwritten = ref_y.clone()
    unwritten[2, 7] = float("nan")
    assert not aggregate_norm.compare(case, unwritten, ref_h, ref_y, ref_h, own)["ok"]
    assert not aggregate_norm.compare(case, 1.5 * ref_y, ref_h, ref_y, ref_h, own)["ok"]
    assert not aggregate_norm.compare(case, ref_y, -ref_h, ref_y, ref_h, own)["ok"]


def test_every_table_title_names_the_gpu() -> None:
    gpu = common.gpu_label((9, 0), "NVIDIA H200")
    assert gpu == "sm_90 (NVIDIA H200)"
    results = [
        {"op": "AttnResAggregate", "check": "gold D=4", "ok": True},
        {"op": "AttnResAggregate", "dtype": "bfloat16", "rel_l2": 3e-3, "ok": True},
        {"op": "AttnResAggregateNorm", "dtype": "float16", "y_rel_l2": 1e-4, "h_rel_l2": 2e-4, "ok": True},
        {"op": "AttnResAggregateNorm", "dtype": "float16", "y_rel_l2": float("nan"), "ok": False},
    ]
    correctness = common.correctness_table(results, gpu)
    assert "sm_90 (NVIDIA H200)" in correctness.title
    assert correctness.row_count == 3
    assert common.worst_rel_l2(results[2]) == 2e-4
    assert common.worst_rel_l2(results[0]) is None
    timing = {"n": 9, "rows": 1, "d": 7168, "dtype": "bfloat16", "kernel_us": 5.0, "kernel_gbps": 100.0,
              "fraction_of_copy": 0.5, "speedup_vs_eager": 3.0}
    assert "sm_90 (NVIDIA H200)" in aggregate.SELFTEST.perf_table([timing], gpu).title
    attention = {**asdict(rsa.performance_cases(quick=True)[0]), "kernel_us": 1e3, "kernel_tflops": 1.0,
                 "eager_us": 2e3, "speedup_vs_eager": 2.0, "sdpa_us": 5e2}
    assert "sm_90 (NVIDIA H200)" in rsa.SELFTEST.perf_table([attention], gpu).title


def test_tables_render_as_aligned_plain_text() -> None:
    """Numbers align right, text left, every column as wide as its widest cell (no rich in the library)."""
    text = render_text(table("Title on sm_90", ("op", "passed"), [("AttnResAggregate", "3/3"), ("rsa", "10/12")],
                             right=("passed",)))
    assert text.splitlines() == [
        "Title on sm_90",
        "op                passed",
        "----------------  ------",
        "AttnResAggregate     3/3",
        "rsa                10/12",
    ]
    with pytest.raises(ValueError, match="has 1 cells for 2 columns"):
        table("t", ("a", "b"), [("only one",)])


def test_every_op_is_selectable_and_runs_in_the_order_of_the_brief() -> None:
    assert list(run.OPS) == ["aggregate", "aggregate_norm", "rsa"]
    assert [t.op for t in run.OPS.values()] == ["AttnResAggregate", "AttnResAggregateNorm", "ResidualScoreAttention"]
    timed = [t.name for t in run.OPS.values() if isinstance(t, common.TimedOpSelftest)]
    assert timed == ["aggregate", "rsa"], "AttnResAggregateNorm is correctness only"


@pytest.mark.slow
def test_module_entry_point_runs_without_a_gpu_and_without_rich() -> None:
    """``python -m attnres_export.plugins.selftest`` (the documented command) lists cases, and neither the entry
    point nor anything it imports loads rich."""
    script = ("import runpy, sys; sys.argv = ['selftest', '--dry-run', '--op', 'rsa', '--quick']\n"
              "try:\n    runpy.run_module('attnres_export.plugins.selftest', run_name='__main__')\n"
              "except SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
              "assert 'rich' not in sys.modules, 'the self-test imported rich'\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "check rsa B=1 H=1 Tq=1 Tk=1 dh=64 dv=64 float32" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_selftest_quick_on_gpu() -> None:
    assert run.main(["--quick"]) == 0
