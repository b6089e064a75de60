"""What every fusion pattern reads: the graph, the values of its reference run and the injected numerics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from attnres_export.graphs.fusion.capture import capture_all
from attnres_export.graphs.fusion.classify import activations
from attnres_export.graphs.fusion.graph import GraphIndex
from attnres_export.graphs.fusion.handwritten import handwritten_softmaxes
from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.types import value_types


@dataclass
class FusionContext:
    """One graph as the patterns see it (built once per ``fuse_model``; read-only for the patterns)."""

    model: onnx.ModelProto
    index: GraphIndex
    values: dict[str, np.ndarray]
    """Every value of the graph on the feeds that drive the fusion (the reference run)."""
    types: dict[str, int]
    """Declared element types (the captured arrays of an emulated bfloat16 graph are float32)."""
    depends_on_input: Callable[[str], bool]
    numerics: Numerics
    seed: int
    softmaxes: list[onnx.NodeProto]
    """The anchors every pattern starts from: each default-domain Softmax, then each hand-written one
    (handwritten.py), in that order."""
    position: dict[int, int] = field(default_factory=dict)
    """Index of each softmax (by ``id``) in ``softmaxes``."""

    @classmethod
    def build(cls, model: onnx.ModelProto, feeds: dict[str, np.ndarray], numerics: Numerics,
              seed: int) -> FusionContext:
        values = capture_all(model, feeds, numerics)
        index = GraphIndex(model)
        softmaxes = [n for n in index.nodes if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]
        softmaxes += handwritten_softmaxes(index)
        return cls(model, index, values, value_types(model), activations(index), numerics, seed, softmaxes,
                   {id(node): i for i, node in enumerate(softmaxes)})

    def constant_of(self, name: str) -> np.ndarray | None:
        """The value of a tensor that depends on no graph input: an initializer, a Constant, or computed from
        them only (read off the reference run)."""
        value = self.index.constant(name)
        if value is None and name in self.values and not self.depends_on_input(name):
            value = self.values[name]
        return value
