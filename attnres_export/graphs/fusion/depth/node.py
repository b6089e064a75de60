"""The fused AttnResAggregate node that replaces a recognised aggregation (docs/op-set.md#targets)."""

from __future__ import annotations

import onnx
from onnx import helper as oh

from attnres_export.ops.opset import AGGREGATE, DOMAIN, PLUGIN_NAMESPACE, PLUGIN_VERSION


def aggregate_node(name: str, score_weight: str, sources: list[str], output: str, eps: float) -> onnx.NodeProto:
    return oh.make_node(
        AGGREGATE, [score_weight, *sources], [output], name=name, domain=DOMAIN,
        eps=float(eps), plugin_version=PLUGIN_VERSION, plugin_namespace=PLUGIN_NAMESPACE,
    )
