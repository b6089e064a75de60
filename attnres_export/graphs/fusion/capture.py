"""Running a whole graph once and keeping every intermediate value."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper as oh

from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.onnx_utils import copy_model
from attnres_export.graphs.types import value_types


def capture_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray], numerics: Numerics) -> dict[str, np.ndarray]:
    """Every value of the graph (inputs, initializer-free intermediates, outputs) on ``feeds``."""
    probe = copy_model(model)
    types = value_types(probe)
    present = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in present and name in types:
                probe.graph.output.append(oh.make_tensor_value_info(name, types[name], None))
                present.add(name)
    values = dict(feeds)
    values.update(numerics.run(probe, feeds))
    return values
