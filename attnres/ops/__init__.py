"""The attnres op set on the PyTorch side: custom ops, their reference math and a NumPy reference."""

from attnres.ops.aggregate import attnres_aggregate, attnres_aggregate_reference
from attnres.ops.identity import AGGREGATE, DOMAIN, MAX_SOURCES, PLUGIN_NAMESPACE, PLUGIN_VERSION
from attnres.ops.numpy_ref import attnres_aggregate_numpy, attnres_aggregate_numpy_in

__all__ = [
    "AGGREGATE",
    "DOMAIN",
    "MAX_SOURCES",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "attnres_aggregate",
    "attnres_aggregate_numpy",
    "attnres_aggregate_numpy_in",
    "attnres_aggregate_reference",
]
