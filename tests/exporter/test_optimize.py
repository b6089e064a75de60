"""The export keeps every constant exactly: onnxscript's default rewrite rules would drop ``+ eps`` for eps <= 1e-8
(its no-op rule compares with abs_tol=1e-8), turning an RMSNorm of a zero row into 0 * inf = NaN."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from attnres_export.exporter.to_onnx import quiet_torch_onnx_export
from tests.conftest import slow_after


class TinyEpsNorm(torch.nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


@pytest.mark.parametrize("eps", slow_after([1e-8, 1e-9, 1e-12]))
def test_a_tiny_eps_survives_the_export_and_a_zero_row_stays_finite(eps: float) -> None:
    program = quiet_torch_onnx_export(TinyEpsNorm(eps), (torch.randn(2, 8),), opset_version=18)
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros((2, 8), np.float32)
    x[1] = np.arange(8) * 1e-5
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    expected = TinyEpsNorm(eps)(torch.from_numpy(x)).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
