"""GPU self-test of the ResidualScoreAttention kernel (``--op rsa`` of ``python -m attnres_export.plugins.selftest``).

Calls ``residualScoreAttentionLaunch`` of libattnres_kernels.so through ctypes (no TensorRT), checks both
outputs (``out`` and the running score sum ``scores``) against the float32 PyTorch reference
(``attnres_export.ops.residual_score_attention_reference``) on fresh random inputs with NaN-poisoned outputs,
and times the kernel next to that reference in eager mode and, for context only, torch SDPA (which
neither adds prev_scores nor writes the scores).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnres_export.ops import residual_score_attention_reference
from attnres_export.plugins.selftest.common import DTYPES, TimedOpSelftest, gpu_times_us, passes
from attnres_export.plugins.selftest.table import TextTable, table

MASK_KINDS = ("none", "keys", "rows", "full")
"""mask_bias absent; [B,1,1,Tk] key padding (-10000); [B,1,Tq,Tk] random; [B,H,Tq,Tk] random."""

PAD_BIAS = -10000.0


@dataclass(frozen=True)
class AttentionCase:
    """One call: q [b,h,tq,dh], k [b,h,tk,dh], v [b,h,tk,dv]; optional inputs and the divisor."""

    b: int
    h: int
    tq: int
    tk: int
    dh: int
    dv: int
    dtype: str
    prev: bool = True
    mask: str = "keys"
    divisor: float = 1.0
    inplace: bool = False  # scores written over prev_scores (the launcher allows exact aliasing)

    def __str__(self) -> str:
        return (
            f"rsa B={self.b} H={self.h} Tq={self.tq} Tk={self.tk} dh={self.dh} dv={self.dv} {self.dtype} "
            f"prev={int(self.prev)} mask={self.mask} divisor={self.divisor:g}{' inplace' if self.inplace else ''}"
        )

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.dh)

    def flops(self) -> float:
        """Multiply-adds of QK^T and PV, counted as 2 flops each."""
        return 2.0 * self.b * self.h * self.tq * self.tk * (self.dh + self.dv)


def correctness_cases(quick: bool) -> list[AttentionCase]:
    """Head sizes 1..128 (64/128 and odd ones), Tq = 1, Tk off the tile, each optional input, every dtype."""
    shapes = [
        (1, 1, 1, 1, 64, 64),
        (2, 3, 1, 77, 64, 64),  # decode-like, Tk not a multiple of the key tile
        (2, 2, 1, 300, 128, 128),
        (2, 2, 37, 77, 32, 32),
        (2, 2, 65, 100, 80, 80),
        (1, 2, 64, 64, 72, 96),
        (2, 2, 50, 130, 128, 128),
        (2, 4, 129, 129, 96, 40),
        (1, 1, 3, 5, 1, 1),
        (2, 2, 70, 33, 128, 64),
    ]
    if not quick:
        shapes += [(2, 4, 200, 257, 64, 64), (1, 3, 257, 200, 128, 128), (1, 2, 33, 1000, 100, 100)]
    combos = [(True, "keys", 3.0), (False, "none", 1.0), (False, "keys", 1.0), (True, "none", 2.0)]
    cases: list[AttentionCase] = []
    for dtype in DTYPES:
        for idx, (b, h, tq, tk, dh, dv) in enumerate(shapes):
            picked = combos if (idx < 4 or not quick) else combos[:1]
            cases += [AttentionCase(b, h, tq, tk, dh, dv, dtype, p, m, d) for p, m, d in picked]
        cases += [
            AttentionCase(2, 3, 40, 90, 64, 64, dtype, True, "rows", 2.0),
            AttentionCase(2, 3, 40, 90, 128, 128, dtype, True, "full", 4.0),
            AttentionCase(2, 2, 40, 90, 64, 64, dtype, True, "keys", 5.0, inplace=True),
        ]
        big = [(8, 16, 2048, 2048, 64, 64)] + ([] if quick else [(8, 16, 2048, 2048, 128, 128)])
        cases += [AttentionCase(*shape, dtype, True, "keys", 6.0) for shape in big]
        cases.append(AttentionCase(8, 16, 1, 2048, 128, 128, dtype, True, "keys", 6.0))
    return cases


def performance_cases(quick: bool) -> list[AttentionCase]:
    """B=8, H=16, T=2048 with prev_scores and a key-padding mask (a middle layer), dh = 64 and 128."""
    dtypes = ("bfloat16",) if quick else tuple(DTYPES)
    return [AttentionCase(8, 16, 2048, 2048, d, d, dt, True, "keys", 3.0) for dt in dtypes for d in (64, 128)]


class AttentionKernel:
    """ctypes binding of residualScoreAttentionLaunch."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        fn = self.lib.residualScoreAttentionLaunch
        fn.argtypes = [
            ctypes.c_void_p,  # q
            ctypes.c_void_p,  # k
            ctypes.c_void_p,  # v
            ctypes.c_void_p,  # prevScores
            ctypes.c_void_p,  # maskBias
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,  # mask strides B, H, Q, K
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,  # B, H, Tq, Tk, dh, dv
            ctypes.c_float,  # scale
            ctypes.c_float,  # logitDivisor
            ctypes.c_int32,  # dtype
            ctypes.c_void_p,  # out
            ctypes.c_void_p,  # scores
            ctypes.c_void_p,  # stream
        ]
        fn.restype = ctypes.c_int
        self.fn = fn

    def launch(
        self,
        case: AttentionCase,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        prev: torch.Tensor | None,
        mask: torch.Tensor | None,
        out: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        """Enqueue on torch's current stream; raise on a CUDA error code."""
        strides = mask_strides(mask)
        status = self.fn(
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            prev.data_ptr() if prev is not None else None,
            mask.data_ptr() if mask is not None else None,
            *strides,
            case.b,
            case.h,
            case.tq,
            case.tk,
            case.dh,
            case.dv,
            case.scale,
            case.divisor,
            DTYPES[case.dtype][1],
            out.data_ptr(),
            scores.data_ptr(),
            torch.cuda.current_stream().cuda_stream,
        )
        if status != 0:
            raise RuntimeError(f"residualScoreAttentionLaunch returned cudaError {status}")


def mask_strides(mask: torch.Tensor | None) -> tuple[int, int, int, int]:
    """Element strides of a rank-4 mask broadcast to [B,H,Tq,Tk]: 0 along its size-1 axes."""
    if mask is None:
        return (0, 0, 0, 0)
    return tuple(0 if mask.shape[i] == 1 else mask.stride(i) for i in range(4))  # type: ignore[return-value]


def make_inputs(case: AttentionCase, generator: torch.Generator) -> dict[str, torch.Tensor | None]:
    """q, k, v in the case's dtype (logits of a few units), float32 prev_scores and mask_bias."""
    dtype = DTYPES[case.dtype][0]

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=generator) * scale

    q = randn(case.b, case.h, case.tq, case.dh, scale=1.5).to(dtype)
    k = randn(case.b, case.h, case.tk, case.dh, scale=1.5).to(dtype)
    v = randn(case.b, case.h, case.tk, case.dv).to(dtype)
    prev = randn(case.b, case.h, case.tq, case.tk, scale=2.0) if case.prev else None
    mask = None
    if case.mask == "keys":
        lengths = torch.randint(max(1, case.tk // 2), case.tk + 1, (case.b,), device="cuda", generator=generator)
        keys = torch.arange(case.tk, device="cuda")
        mask = torch.where(keys[None, :] < lengths[:, None], 0.0, PAD_BIAS).view(case.b, 1, 1, case.tk)
    elif case.mask == "rows":
        mask = randn(case.b, 1, case.tq, case.tk)
    elif case.mask == "full":
        mask = randn(case.b, case.h, case.tq, case.tk)
    return {"q": q, "k": k, "v": v, "prev": prev, "mask": mask}


class _Metrics:
    """Streaming relative L2, cosine, max abs error and NaN count over chunks, in float64."""

    def __init__(self) -> None:
        self.diff2 = self.ref2 = self.out2 = self.dot = self.max_abs = 0.0
        self.nan = 0

    def add(self, out: torch.Tensor, ref: torch.Tensor) -> None:
        o, r = out.double().flatten(), ref.double().flatten()
        self.nan += int(torch.isnan(o).sum())
        d = o - r
        self.diff2 += float((d * d).sum())
        self.ref2 += float((r * r).sum())
        self.out2 += float((o * o).sum())
        self.dot += float((o * r).sum())
        self.max_abs = max(self.max_abs, float(d.abs().max()))

    def result(self) -> tuple[float, float, float, int]:
        rel = math.sqrt(self.diff2) / max(math.sqrt(self.ref2), 1e-300)
        cos = self.dot / max(math.sqrt(self.out2 * self.ref2), 1e-300)
        if math.isnan(self.diff2):
            rel, cos = float("nan"), float("nan")
        return rel, cos, self.max_abs, self.nan


def check_case(kernel: AttentionKernel, case: AttentionCase, generator: torch.Generator) -> dict:
    """One launch on NaN-poisoned outputs, compared per batch row with the float32 reference."""
    x = make_inputs(case, generator)
    dtype = DTYPES[case.dtype][0]
    prev = x["prev"]
    prev_copy = prev.clone() if (prev is not None and case.inplace) else prev
    out = torch.full((case.b, case.h, case.tq, case.dv), float("nan"), dtype=dtype, device="cuda")
    if case.inplace and prev is not None:
        scores = prev  # written over prev_scores
    else:
        scores = torch.full((case.b, case.h, case.tq, case.tk), float("nan"), device="cuda")
    kernel.launch(case, x["q"], x["k"], x["v"], prev, x["mask"], out, scores)
    out_m, score_m = _Metrics(), _Metrics()
    for b in range(case.b):  # chunks bound the reference's memory at B=8, H=16, T=2048
        sl = slice(b, b + 1)
        mask = x["mask"][sl] if x["mask"] is not None else None
        ref_out, ref_scores = residual_score_attention_reference(
            x["q"][sl].float(),
            x["k"][sl].float(),
            x["v"][sl].float(),
            prev_copy[sl] if prev_copy is not None else None,
            mask,
            case.scale,
            case.divisor,
        )
        out_m.add(out[sl].float(), ref_out)
        score_m.add(scores[sl], ref_scores)
        del ref_out, ref_scores
    torch.cuda.synchronize()
    o_rel, o_cos, o_max, o_nan = out_m.result()
    s_rel, s_cos, s_max, s_nan = score_m.result()
    # scores are float32 arithmetic on the same (upcast) inputs for every storage type: float32 bars
    ok = o_nan == 0 and s_nan == 0 and passes(case.dtype, o_rel, o_cos) and passes("float32", s_rel, s_cos)
    return {
        **asdict(case),
        "out_rel_l2": o_rel,
        "out_cosine": o_cos,
        "out_max_abs": o_max,
        "out_unwritten": o_nan,
        "scores_rel_l2": s_rel,
        "scores_cosine": s_cos,
        "scores_max_abs": s_max,
        "scores_unwritten": s_nan,
        "ok": ok,
    }


def check_rejects_bad_arguments(kernel: AttentionKernel) -> dict:
    """dh > 128, a zero divisor and a NULL q come back as cudaErrorInvalidValue (1), launching nothing."""
    case = AttentionCase(1, 1, 4, 4, 64, 64, "float32", prev=False, mask="none")
    t = torch.zeros(1, 1, 4, 64, device="cuda")
    scores = torch.zeros(1, 1, 4, 4, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    args = [t.data_ptr(), t.data_ptr(), t.data_ptr(), None, None, 0, 0, 0, 0, 1, 1, 4, 4, 64, 64, case.scale, 1.0, 0]
    codes = []
    for change in ({13: 129}, {16: 0.0}, {0: None}, {17: 7}):
        bad = list(args)
        for index, value in change.items():
            bad[index] = value
        codes.append(kernel.fn(*bad, t.data_ptr(), scores.data_ptr(), stream))
    good = kernel.fn(*args, t.data_ptr(), scores.data_ptr(), stream)
    torch.cuda.synchronize()
    return {"check": "rsa argument validation", "codes": codes, "good": good, "ok": codes == [1] * 4 and good == 0}


def time_case(kernel: AttentionKernel, case: AttentionCase, generator: torch.Generator, quick: bool) -> dict:
    """Kernel, the eager float32 reference on the same inputs, and torch SDPA (context: no scores)."""
    x = make_inputs(case, generator)
    dtype = DTYPES[case.dtype][0]
    out = torch.empty(case.b, case.h, case.tq, case.dv, dtype=dtype, device="cuda")
    scores = torch.empty(case.b, case.h, case.tq, case.tk, device="cuda")
    iters = 10 if quick else 20
    buffers = {"out": out, "scores": scores}

    def run_kernel(_i: int) -> None:
        kernel.launch(case, x["q"], x["k"], x["v"], x["prev"], x["mask"], buffers["out"], buffers["scores"])

    kernel_us = gpu_times_us(run_kernel, 1, iters)
    buffers.clear()
    del out, scores

    def eager(_i: int) -> None:
        residual_score_attention_reference(x["q"], x["k"], x["v"], x["prev"], x["mask"], case.scale, case.divisor)

    eager_us = gpu_times_us(eager, 1, 5)
    torch.cuda.empty_cache()
    sdpa_mask = x["mask"].to(dtype) if x["mask"] is not None else None
    try:
        sdpa_us = gpu_times_us(
            lambda _i: torch.nn.functional.scaled_dot_product_attention(
                x["q"], x["k"], x["v"], attn_mask=sdpa_mask, scale=case.scale
            ),
            1,
            iters,
        )
    except RuntimeError:
        sdpa_us = float("nan")
    return {
        **asdict(case),
        "kernel_us": kernel_us,
        "kernel_tflops": case.flops() / kernel_us / 1e6,
        "eager_us": eager_us,
        "speedup_vs_eager": eager_us / kernel_us,
        "sdpa_us": sdpa_us,
    }


OP = "ResidualScoreAttention"


class ResidualScoreAttentionSelftest(TimedOpSelftest):
    op = OP
    name = "rsa"
    timings_key = "rsa_performance"

    def correctness_cases(self, quick: bool) -> list[AttentionCase]:
        return correctness_cases(quick)

    def performance_cases(self, quick: bool) -> list[AttentionCase]:
        return performance_cases(quick)

    def run_checks(self, library: Path, cases: list[AttentionCase], generator: torch.Generator) -> list[dict]:
        """Argument validation, then every correctness case."""
        kernel = AttentionKernel(library)
        results = [check_rejects_bad_arguments(kernel)]
        for case in cases:
            try:
                results.append(check_case(kernel, case, generator))
            except RuntimeError as exc:
                results.append({**asdict(case), "error": str(exc), "ok": False})
            torch.cuda.empty_cache()
        return [{"op": OP, **r} for r in results]

    def run_timings(self, library: Path, cases: list[AttentionCase], generator: torch.Generator,
                    quick: bool) -> list[dict]:
        kernel = AttentionKernel(library)
        timings = []
        for case in cases:
            timings.append(time_case(kernel, case, generator, quick))
            torch.cuda.empty_cache()
        return timings

    def perf_table(self, rows: list[dict], gpu: str) -> TextTable:
        columns = ("B", "H", "T", "dh", "dtype", "kernel ms", "TFLOP/s", "eager ms", "vs eager", "SDPA ms")
        cells = [(str(r["b"]), str(r["h"]), str(r["tq"]), str(r["dh"]), r["dtype"], f"{r['kernel_us'] / 1e3:.2f}",
                  f"{r['kernel_tflops']:.1f}", f"{r['eager_us'] / 1e3:.2f}", f"{r['speedup_vs_eager']:.1f}x",
                  f"{r['sdpa_us'] / 1e3:.2f}") for r in rows]
        return table("ResidualScoreAttention kernel vs PyTorch eager reference (and SDPA, no scores, context) "
                     f"on {gpu}", columns, cells, right=columns)


SELFTEST = ResidualScoreAttentionSelftest()
