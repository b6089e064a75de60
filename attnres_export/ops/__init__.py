"""The attnres op set on the PyTorch side: custom ops, their reference math and a NumPy reference."""

from attnres_export.ops.aggregate import attnres_aggregate, attnres_aggregate_reference
from attnres_export.ops.numpy_ref import (
    attnres_aggregate_numpy,
    attnres_aggregate_numpy_in,
    residual_score_attention_numpy,
    residual_score_attention_numpy_in,
)
from attnres_export.ops.opset import (
    AGGREGATE,
    DOMAIN,
    MAX_SOURCES,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    RESIDUAL_ATTENTION,
)
from attnres_export.ops.residual_attention import residual_score_attention, residual_score_attention_reference

__all__ = [
    "AGGREGATE",
    "DOMAIN",
    "MAX_SOURCES",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "RESIDUAL_ATTENTION",
    "attnres_aggregate",
    "attnres_aggregate_numpy",
    "attnres_aggregate_numpy_in",
    "attnres_aggregate_reference",
    "residual_score_attention",
    "residual_score_attention_numpy",
    "residual_score_attention_numpy_in",
    "residual_score_attention_reference",
]
