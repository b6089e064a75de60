"""GPU self-test of the AttnResAggregateNorm launcher (``--op aggregate_norm`` of
``python -m attnres_export.plugins.selftest``).

Calls ``attnresAggregateNormLaunch`` of libattnres_kernels.so through ctypes (no TensorRT) on fresh random inputs
with NaN-poisoned outputs and checks, at the pass bars of the AttnResAggregate cases:
- ``y`` and ``h`` against ``attnres_aggregate_norm_reference`` on the sources as stored (the op's contract: h
  rounded to T, the norm computed in float32 from that h);
- ``y`` against the float32 RMSNorm of the kernel's own ``h`` (``rms_norm_reference``), which checks the new
  RMSNorm kernel alone;
- a gold value (D = 4) and the launcher's refusal of bad arguments.

No timings: the launcher is the composed correctness path (the AttnResAggregate kernel, then a row-wise RMSNorm
kernel); a fused kernel is later work (docs/plugins.md).
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnres_export.ops.aggregate_norm import attnres_aggregate_norm_reference, rms_norm_reference
from attnres_export.plugins.selftest.common import (
    DTYPES,
    OpSelftest,
    error_metrics,
    passes,
    pointer_table,
    random_sources,
)

OP = "AttnResAggregateNorm"
EPS = 1e-6
NORM_EPS = 1e-5
INVALID_VALUE = 1
"""cudaErrorInvalidValue."""


@dataclass(frozen=True)
class NormCase:
    """n sources of [rows, d]; misaligned sources (and outputs) take the one-element paths."""

    n: int
    rows: int
    d: int
    dtype: str
    misaligned: bool = False

    def __str__(self) -> str:
        misaligned = " misaligned" if self.misaligned else ""
        return f"aggregate_norm n={self.n} rows={self.rows} D={self.d} {self.dtype}{misaligned}"


def correctness_cases(quick: bool) -> list[NormCase]:
    """D = 7, 64, 1000 (16-byte packs for every type), 1001 (odd: one element at a time), 7168 (decode-like) and
    20000 (the aggregate's two-sweep path); 1, 3, 9 and 33 sources; one row and a few; then large row counts."""
    ds = (7, 64, 1000, 1001, 7168) if quick else (7, 64, 1000, 1001, 4096, 7168, 20000)
    ns = (1, 3, 9, 33)
    cases: list[NormCase] = []
    for dtype in DTYPES:
        cases += [NormCase(n, rows, d, dtype) for d in ds for n in ns for rows in (1, 7)]
        # 1.1M rows: more than the RMSNorm kernel's 2^20 blocks, so blocks take a second row (grid stride).
        big = [(9, 4096, 7168), (3, 16384, 1000), (33, 1, 7168), (1, 1_100_000, 8)]
        if not quick:
            big += [(1, 16384, 64), (9, 2048, 1001), (33, 4096, 1000), (3, 70000, 64)]
        cases += [NormCase(n, rows, d, dtype) for n, rows, d in big]
        cases += [NormCase(3, 7, 1000, dtype, misaligned=True), NormCase(9, 5, 7168, dtype, misaligned=True)]
    return cases


class NormKernel:
    """ctypes binding of attnresAggregateNormLaunch."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        fn = self.lib.attnresAggregateNormLaunch
        fn.argtypes = [
            ctypes.c_void_p,  # scoreWeight
            ctypes.c_void_p,  # normWeight
            ctypes.POINTER(ctypes.c_void_p),  # sources (host array)
            ctypes.c_int32,  # numSources
            ctypes.c_int64,  # rows
            ctypes.c_int32,  # d
            ctypes.c_float,  # eps
            ctypes.c_float,  # normEps
            ctypes.c_int32,  # dtype
            ctypes.c_void_p,  # outY
            ctypes.c_void_p,  # outH
            ctypes.c_void_p,  # stream
        ]
        fn.restype = ctypes.c_int
        self.fn = fn

    def launch(self, sw: torch.Tensor, nw: torch.Tensor, sources: list[torch.Tensor], case: NormCase,
               y: torch.Tensor, h: torch.Tensor) -> None:
        """Enqueue on torch's current stream; raise on a CUDA error code."""
        status = self.fn(sw.data_ptr(), nw.data_ptr(), pointer_table(sources), case.n, case.rows, case.d, EPS,
                         NORM_EPS, DTYPES[case.dtype][1], y.data_ptr(), h.data_ptr(),
                         torch.cuda.current_stream().cuda_stream)
        if status != 0:
            raise RuntimeError(f"attnresAggregateNormLaunch returned cudaError {status}")


def make_weights(d: int, generator: torch.Generator, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """score_weight giving logits of a few units, and a norm_weight around 1 with either sign present."""
    sw = torch.randn(d, device=device, generator=generator) * (3.0 / d**0.5)
    nw = 1.0 + 0.5 * torch.randn(d, device=device, generator=generator)
    return sw, nw


def poisoned(case: NormCase) -> torch.Tensor:
    """A NaN-filled [rows, d] output of the case's dtype; misaligned cases get one starting an element in."""
    dtype = DTYPES[case.dtype][0]
    if case.misaligned:
        flat = torch.full((case.rows * case.d + 1,), float("nan"), dtype=dtype, device="cuda")
        return flat[1:].view(case.rows, case.d)
    return torch.full((case.rows, case.d), float("nan"), dtype=dtype, device="cuda")


def compare(case: NormCase, y: torch.Tensor, h: torch.Tensor, ref_y: torch.Tensor, ref_h: torch.Tensor,
            own_y: torch.Tensor) -> dict:
    """Metrics of y and h against the reference and of y against the norm of the kernel's own h; ``ok`` when
    every output is written and all three pass the dtype's bar."""
    result: dict = {"op": OP, **asdict(case)}
    ok = True
    for name, out, ref in (("y", y, ref_y), ("h", h, ref_h), ("y_own_h", y, own_y)):
        rel_l2, cosine, max_abs = error_metrics(out.float(), ref.float())
        result.update({f"{name}_rel_l2": rel_l2, f"{name}_cosine": cosine, f"{name}_max_abs": max_abs})
        ok = ok and passes(case.dtype, rel_l2, cosine)
    result["y_unwritten"] = int(torch.isnan(y).sum())
    result["h_unwritten"] = int(torch.isnan(h).sum())
    result["ok"] = ok and result["y_unwritten"] == 0 and result["h_unwritten"] == 0
    return result


def check_case(kernel: NormKernel, case: NormCase, generator: torch.Generator) -> dict:
    """One launch on NaN-poisoned y and h, compared with the references."""
    sw, nw = make_weights(case.d, generator)
    sources = random_sources(case.n, case.rows, case.d, case.dtype, case.misaligned, generator)
    y, h = poisoned(case), poisoned(case)
    kernel.launch(sw, nw, sources, case, y, h)
    ref_y, ref_h = attnres_aggregate_norm_reference(sw, nw, sources, EPS, NORM_EPS)
    torch.cuda.synchronize()
    own_y = rms_norm_reference(h, nw, NORM_EPS)
    return compare(case, y, h, ref_y, ref_h, own_y)


GOLD_H = (0.98201379, 0.01798621, 0.0, 0.0)
GOLD_Y = (1.99966462, 0.07325027, 0.0, 0.0)
"""D = 4, sources e0 and e1, score_weight 2 e0, eps = 0 (docs/parity.md#gold-checks) give GOLD_H; with
norm_weight [1, 2, 3, 4] and norm_eps = 0, y = h / sqrt(mean(h^2)) * norm_weight = GOLD_Y (float64)."""


def check_gold(kernel: NormKernel) -> dict:
    """The gold value in float32, with eps = norm_eps = 0."""
    sw = torch.tensor([2.0, 0.0, 0.0, 0.0], device="cuda")
    nw = torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda")
    sources = [torch.tensor([[1.0, 0, 0, 0]], device="cuda"), torch.tensor([[0.0, 1, 0, 0]], device="cuda")]
    y = torch.full((1, 4), float("nan"), device="cuda")
    h = torch.full((1, 4), float("nan"), device="cuda")
    status = kernel.fn(sw.data_ptr(), nw.data_ptr(), pointer_table(sources), 2, 1, 4, 0.0, 0.0, 0, y.data_ptr(),
                       h.data_ptr(), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    if status != 0:
        return {"op": OP, "check": "gold D=4", "status": status, "ok": False}
    err_h = float((h - torch.tensor([GOLD_H], device="cuda")).abs().max())
    err_y = float((y - torch.tensor([GOLD_Y], device="cuda")).abs().max())
    return {"op": OP, "check": "gold D=4", "status": status, "h_max_abs": err_h, "y_max_abs": err_y,
            "ok": err_h < 1e-6 and err_y < 2e-6}


def check_rejects_bad_arguments(kernel: NormKernel) -> dict:
    """Null pointers, 0 or 257 sources, d = 0, rows < 0, a negative or NaN eps / norm_eps, an unknown dtype and
    y = h come back as cudaErrorInvalidValue; nothing is written (y and h stay NaN)."""
    d, rows = 8, 2
    sw = torch.zeros(d, device="cuda")
    nw = torch.ones(d, device="cuda")
    source = torch.ones(rows, d, device="cuda")
    y = torch.full((rows, d), float("nan"), device="cuda")
    h = torch.full((rows, d), float("nan"), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    many = pointer_table([source] * 257)
    args = [sw.data_ptr(), nw.data_ptr(), pointer_table([source]), 1, rows, d, 1e-6, 1e-5, 0, y.data_ptr(),
            h.data_ptr(), stream]
    changes = (
        {0: None}, {1: None}, {2: None}, {9: None}, {10: None}, {3: 0}, {2: many, 3: 257}, {5: 0}, {4: -1},
        {6: -1.0}, {7: -1.0}, {7: float("nan")}, {8: 7}, {10: y.data_ptr()},
    )
    codes = []
    for change in changes:
        bad = list(args)
        for index, value in change.items():
            bad[index] = value
        codes.append(kernel.fn(*bad))
    torch.cuda.synchronize()
    untouched = bool(torch.isnan(y).all() and torch.isnan(h).all())
    good = kernel.fn(*args)
    torch.cuda.synchronize()
    written = bool(not torch.isnan(y).any() and not torch.isnan(h).any())
    ok = codes == [INVALID_VALUE] * len(changes) and untouched and good == 0 and written
    return {"op": OP, "check": "aggregate_norm argument validation", "codes": codes, "good": good, "ok": ok}


class AggregateNormSelftest(OpSelftest):
    op = OP
    name = "aggregate_norm"

    def correctness_cases(self, quick: bool) -> list[NormCase]:
        return correctness_cases(quick)

    def run_checks(self, library: Path, cases: list[NormCase], generator: torch.Generator) -> list[dict]:
        """Gold and argument checks, then every case."""
        kernel = NormKernel(library)
        results = [check_gold(kernel), check_rejects_bad_arguments(kernel)]
        for case in cases:
            try:
                results.append(check_case(kernel, case, generator))
            except RuntimeError as exc:
                results.append({"op": OP, **asdict(case), "error": str(exc), "ok": False})
            torch.cuda.empty_cache()
        return results


SELFTEST = AggregateNormSelftest()
