"""RealFormer (docs/models.md#realformer): the model and its config (``model.py``), its export plan (``plan.py``)."""

from attnres_export.models.realformer.model import RealFormer, RealFormerConfig

__all__ = ["RealFormer", "RealFormerConfig"]
