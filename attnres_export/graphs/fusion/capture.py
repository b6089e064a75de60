"""Running a whole graph, or a piece of it, on ONNX Runtime CPU and keeping every intermediate value."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from attnres_export.graphs.types import value_types
from attnres_export.parity.runners import OnnxRuntimeRunner


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs on ``feeds`` (attnres nodes through their NumPy reference)."""
    with OnnxRuntimeRunner(model) as runner:
        return runner.infer(feeds)


def capture_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the graph (inputs, initializer-free intermediates, outputs) on ``feeds``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    types = value_types(probe)
    present = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in present and name in types:
                probe.graph.output.append(oh.make_tensor_value_info(name, types[name], None))
                present.add(name)
    values = dict(feeds)
    values.update(run(probe, feeds))
    return values
