"""Reference PyTorch models, their contract (``base.py``), the architecture registry and the checkpoint formats.

Names are imported on first use (PEP 562): the CLI reads ``models.registry`` before any option is checked, and that
must not import torch.
"""

from __future__ import annotations

import importlib

_WHERE = {"load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint", "ARCHITECTURES": "registry",
          "architecture": "registry", "build_model": "registry"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
