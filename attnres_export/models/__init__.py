"""Reference PyTorch models, their contract (``base.py``), the architecture registry and the checkpoint formats."""

from attnres_export.models.checkpoint import load_checkpoint, save_checkpoint
from attnres_export.models.registry import ARCHITECTURES, architecture, build_model

__all__ = ["ARCHITECTURES", "architecture", "build_model", "load_checkpoint", "save_checkpoint"]
