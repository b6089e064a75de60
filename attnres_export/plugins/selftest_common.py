"""What both kernels' self-tests share: storage types with their launcher codes, and the pass bars
(docs/parity.md#pass-bars).

Imports only torch and ``attnres_export.dtypes``, so the self-test runs on a GPU machine without ONNX Runtime.
"""

from __future__ import annotations

import torch

from attnres_export.dtypes import STORAGE_TYPES

DTYPES: dict[str, tuple[torch.dtype, int]] = {
    name: (getattr(torch, name), storage.kernel_code) for name, storage in STORAGE_TYPES.items()
}
"""Name -> (torch dtype, the launchers' dtype code)."""


def passes(dtype: str, rel_l2: float, cosine: float) -> bool:
    """The pass bar of ``dtype`` against the float32 reference; NaN never passes."""
    bar = STORAGE_TYPES[dtype].tolerance
    return rel_l2 <= bar.rel_l2 and cosine >= bar.cosine
