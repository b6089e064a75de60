"""The attnres op set on the PyTorch side: custom ops, their reference math and a NumPy reference.

Importing the package registers every custom op of ``ops/descriptors.py`` with torch (the exporter's translation
table looks each one up), so each op module is imported here.
"""

from attnres_export.ops.aggregate import attnres_aggregate, attnres_aggregate_reference
from attnres_export.ops.aggregate_norm import attnres_aggregate_norm, attnres_aggregate_norm_reference
from attnres_export.ops.kimi_delta import kimi_delta_attention, kimi_delta_attention_reference
from attnres_export.ops.numpy_ref import (
    attnres_aggregate_numpy,
    attnres_aggregate_numpy_in,
    kimi_delta_attention_numpy,
    kimi_delta_attention_numpy_in,
    residual_score_attention_numpy,
    residual_score_attention_numpy_in,
)
from attnres_export.ops.opset import (
    AGGREGATE,
    DOMAIN,
    KIMI_DELTA_ATTENTION,
    MAX_SOURCES,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    RESIDUAL_ATTENTION,
)
from attnres_export.ops.residual_attention import residual_score_attention, residual_score_attention_reference

__all__ = [
    "AGGREGATE",
    "DOMAIN",
    "KIMI_DELTA_ATTENTION",
    "MAX_SOURCES",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "RESIDUAL_ATTENTION",
    "attnres_aggregate",
    "attnres_aggregate_norm",
    "attnres_aggregate_norm_reference",
    "attnres_aggregate_numpy",
    "attnres_aggregate_numpy_in",
    "attnres_aggregate_reference",
    "kimi_delta_attention",
    "kimi_delta_attention_numpy",
    "kimi_delta_attention_numpy_in",
    "kimi_delta_attention_reference",
    "residual_score_attention",
    "residual_score_attention_numpy",
    "residual_score_attention_numpy_in",
    "residual_score_attention_reference",
]
