"""What both kernels' self-tests share: storage types with their launcher codes, and the SPEC 6 pass bars.

Imports only torch and ``attnres_export.parity.metrics`` (NumPy), so the self-test runs on a GPU machine without ONNX.
"""

from __future__ import annotations

import torch

from attnres_export.parity.metrics import DEFAULT_TOLERANCES

DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 0),
    "float16": (torch.float16, 1),
    "bfloat16": (torch.bfloat16, 2),
}
"""Name -> (torch dtype, the launchers' dtype code)."""


def passes(dtype: str, rel_l2: float, cosine: float) -> bool:
    """SPEC 6 bars of ``dtype`` against the float32 reference; NaN never passes."""
    bar = DEFAULT_TOLERANCES[dtype]
    return rel_l2 <= bar.rel_l2 and cosine >= bar.cosine
