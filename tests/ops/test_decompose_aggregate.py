"""The portable decomposition of AttnResAggregate computes what the torch op computes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner
from attnres_export.graphs.schemas import register_schemas
from attnres_export.graphs.targets import convert
from attnres_export.ops import attnres_aggregate

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
REL_L2 = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}


def single_node_model(n: int, d: int, dtype: str, score_weight: np.ndarray, opset: int) -> onnx.ModelProto:
    sources = [f"v{i}" for i in range(n)]
    node = oh.make_node("AttnResAggregate", ["sw", *sources], ["h"], name="agg", domain="attnres", eps=1e-6,
                        plugin_version="1", plugin_namespace="attnres")
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info(s, ELEM[dtype], ["rows", d]) for s in sources],
        [oh.make_tensor_value_info("h", ELEM[dtype], ["rows", d])],
        initializer=[numpy_helper.from_array(score_weight, "sw")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid("attnres", 1)])


@pytest.mark.parametrize("dtype", list(ELEM))
@pytest.mark.parametrize(("n", "d", "rows", "opset"), [(1, 64, 1, 18), (2, 1000, 3, 18), (5, 4096, 2, 23),
                                                       (16, 33, 7, 17)])
def test_portable_decomposition_matches_the_torch_op(n, d, rows, opset, dtype):
    register_schemas()
    gen = torch.Generator().manual_seed(n * 10 + d)
    sources = [(torch.randn(rows, d, generator=gen) * (1 + i)).to(TORCH[dtype]) for i in range(n)]
    score_weight = torch.randn(d, generator=gen) * (2.0 / d**0.5)
    portable = convert(single_node_model(n, d, dtype, score_weight.numpy(), opset), "portable")
    assert {node.domain for node in portable.graph.node} == {""}
    feeds = {f"v{i}": s.float().numpy() if dtype == "bfloat16" else s.numpy() for i, s in enumerate(sources)}
    with OnnxRuntimeRunner(portable) as runner:
        got = runner.infer(feeds)["h"].astype(np.float64)
    expected = attnres_aggregate(score_weight, sources, 1e-6).double().numpy()
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= REL_L2[dtype]
