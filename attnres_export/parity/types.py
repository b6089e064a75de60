"""The data a parity check passes between its steps (parity/session.py), the comparison of files on disk
(parity/check.py) and the routing-aware comparison (parity/routing.py): the PyTorch references of one model and
an artifact to judge on them. It imports no other module of ``parity``, so those modules never import each other
for their types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnres_export.backends.base import Runner
from attnres_export.dtypes import Tolerance

Shape = tuple[int, ...]
Feeds = dict[str, np.ndarray]
Status = Callable[[str], None]


@dataclass
class References:
    """The PyTorch side of a check: the feeds and outputs at every shape."""

    shapes: list[Shape]
    feeds: dict[Shape, Feeds]
    expected: dict[Shape, Feeds]
    """float32 PyTorch's outputs (with float64's expert choices where float64 ran)."""
    exact: dict[Shape, Feeds] | None
    """float64 PyTorch's outputs, the reference of the scaled bars (None: judged against float32 PyTorch)."""
    choices: dict[Shape, list] = field(default_factory=dict)
    """float64 PyTorch's own expert choices per shape (one ``[tokens, k]`` tensor per router call; none without
    float64 or routers): what the float32 and 16-bit runs are forced to, and what the routing-aware comparison
    starts from."""
    same_type: dict[str, dict[Shape, Feeds]] = field(default_factory=dict)
    """Per 16-bit type of the artifacts judged against float64: PyTorch's outputs computing in it, with float64's
    expert choices (its arithmetic, not its flips), whose error scales those artifacts' bars."""

    @property
    def judged_against(self) -> tuple[str, dict[Shape, Feeds]]:
        """The name and outputs every artifact is compared with."""
        return ("pytorch-float64", self.exact) if self.exact is not None else ("pytorch-float32", self.expected)


@dataclass
class ArtifactRun:
    """One artifact to judge: how to open it, its dtype (which picks the bar) and the references it is judged on."""

    open: Callable[[], Runner]
    dtype: str
    tolerance: Tolerance
    references: References
    routing: tuple[Path, str] | None = None
    """An ONNX graph's file and the name its rows carry, for the routing-aware comparison when its rows miss their
    bar (docs/parity.md#routing-aware-comparison); None for an artifact whose routers cannot be read (an engine)."""
