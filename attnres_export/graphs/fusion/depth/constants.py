"""Constant sources: the ``torch.zeros_like`` partial block that a static export folds into an initializer.

Such a source has no producer the site's subgraph could take as an input, and its logit may have been folded
with it, so probing cannot vary it. It is held at its value instead: the probe (probe.py) and the check
(verify.py) vary only the other sources, and the fused node reads the constant as one of its sources. Only an
all-zero constant is taken (a zero source still weighs in the softmax with its logit 0, so it stays a source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from attnres_export.graphs.fusion.errors import Rejected
from attnres_export.graphs.fusion.graph import GraphIndex


class GraphConstants(Mapping[str, np.ndarray]):
    """The values of initializers and Constant outputs, read on demand (the reference run keeps neither)."""

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
        self.cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.cache:
            value = self.index.constant(name)
            if value is None:
                raise KeyError(name)
            self.cache[name] = value
        return self.cache[name]

    def __contains__(self, name: object) -> bool:
        """Without reading the value (a weight matrix would be decoded on every look-up)."""
        if not isinstance(name, str):
            return False
        node = self.index.producer.get(name)
        return name in self.index.initializers or (node is not None and node.op_type == "Constant")

    def __iter__(self) -> Iterator[str]:
        return iter(self.index.initializers)

    def __len__(self) -> int:
        return len(self.index.initializers)


def fixed_sources(sources: list[str], graph_constants: Mapping[str, np.ndarray], slots: Mapping[str, np.ndarray],
                  constant_of: Callable[[str], np.ndarray | None]) -> dict[str, np.ndarray]:
    """The sources held at their value: every constant that is all zeros. A constant the subgraph cannot take
    as an input (an initializer, a Constant, a slot of a stacked constant) that is not zero rejects the site;
    a computed one stays a probed input, as before."""
    fixed = {}
    for name in dict.fromkeys(sources):
        pinned = slots.get(name)
        if pinned is None:
            pinned = graph_constants.get(name)
        value = pinned if pinned is not None else constant_of(name)
        if value is not None and not np.any(np.asarray(value, dtype=np.float64)):
            fixed[name] = np.asarray(value)
        elif pinned is not None:
            raise Rejected(f"source {name!r} is a constant that is not zero; only zero constants are taken")
    return fixed
