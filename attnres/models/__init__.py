"""Reference PyTorch models and their checkpoint format."""

from attnres.models.checkpoint import build_model, load_checkpoint, save_checkpoint
from attnres.models.config import ModelConfig

__all__ = ["ModelConfig", "build_model", "load_checkpoint", "save_checkpoint"]
