"""The weight store: one seam between checkpoint formats and everything that reads weights
(docs/architecture.md#the-weight-store).

``open_checkpoint`` reads a checkpoint's config and its tensors' headers (``.pt``, a safetensors file, a sharded
folder, a family's Hugging Face folder seen through its reader); every tensor is a ``StoredTensor`` (shape, stored
type, storage format) read one at a time, cast on read."""

from attnres_export.models.store.checkpoint import (
    Checkpoint,
    StreamedModel,
    held_types,
    keep_float32_names,
    open_checkpoint,
)
from attnres_export.models.store.tensors import DENSE, STORED_TYPES, StoredTensor, check_stored_type

__all__ = ["DENSE", "STORED_TYPES", "Checkpoint", "StoredTensor", "StreamedModel", "check_stored_type",
           "held_types", "keep_float32_names", "open_checkpoint"]
