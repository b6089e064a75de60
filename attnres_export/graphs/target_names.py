"""The names of the targets an exported model is written for (docs/op-set.md#targets), apart from the
conversions in ``targets.py``: the command line lists them as choices without importing onnx."""

TARGETS = ("tensorrt", "portable", "ort-trt", "onnxruntime")

EXPORT_TARGETS = tuple(t for t in TARGETS if t != "ort-trt")
"""Targets ``attnres-export`` writes directly: ``ort-trt`` is not supported by any ONNX Runtime yet, so it is
only written by ``attnres convert``, which says so."""
