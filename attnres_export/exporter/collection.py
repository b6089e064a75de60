"""Garbage collection that does not rescan the interpreter's whole heap (docs/exporter-notes.md#weights-io).

An export creates cyclic garbage (onnx_ir graphs link values and nodes both ways) that must be collected before
the next step opens the staged file, and allocates enough objects to set off automatic full collections. Each full
collection walks every object alive, and with torch, onnx and ONNX Runtime imported that is over 400,000 of them:
about 0.13 s each on this project's machines, paid once to three times per export at any depth. Objects that
existed before the export started (the modules, the loaded model) are frozen for its duration, so a collection
walks only what the export made."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collecting_new_objects_only() -> Iterator[None]:
    """Run the block with every object alive at its start moved to the collector's permanent generation
    (``gc.freeze``), and move them back after it (``gc.unfreeze``: they rejoin the oldest generation)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

