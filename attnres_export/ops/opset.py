"""The identity of the attnres op set, defined once for PyTorch, ONNX and TensorRT (docs/op-set.md); each op's
inputs, attributes and math are its descriptor (``ops/descriptors.py``)."""

from __future__ import annotations

DOMAIN = "attnres"
"""ONNX domain of every op of the set (listed in the model's opset_import)."""

OPSET_VERSION = 1
"""Version of the ``attnres`` ONNX domain."""

PLUGIN_VERSION = "1"
"""``plugin_version`` attribute: TensorRT's parser selects the creator by (name, version, namespace)."""

PLUGIN_NAMESPACE = "attnres"
"""``plugin_namespace`` attribute and the TensorRT plugin namespace."""

ORT_TRT_DOMAIN = "trt.plugins"
"""The only domain ONNX Runtime's TensorRT execution provider hands to TensorRT plugins."""

AGGREGATE = "AttnResAggregate"
"""Op type of one depth aggregation (docs/op-set.md#attnresaggregate); also the TensorRT plugin name."""

AGGREGATE_NORM = "AttnResAggregateNorm"
"""Op type of one depth aggregation followed by the RMSNorm that reads it (docs/op-set.md#attnresaggregatenorm);
also the TensorRT plugin name."""

MAX_SOURCES = 256
"""Most sources one AttnResAggregate node takes."""

RESIDUAL_ATTENTION = "ResidualScoreAttention"
"""Op type of one RealFormer attention with residual scores (docs/op-set.md#residualscoreattention); also the
TensorRT plugin name."""

KIMI_DELTA_ATTENTION = "KimiDeltaAttention"
"""Op type of the gated delta rule of one Kimi Delta Attention layer (docs/op-set.md#kimideltaattention); the
TensorRT plugin name it is meant for (no plugin exists yet)."""
