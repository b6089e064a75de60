"""The runner interface (Polygraphy's idea): ``activate``, ``infer``, ``deactivate``.

Adding a backend is one class. Every runner takes and returns NumPy arrays keyed by tensor name.
"""

from __future__ import annotations

import abc

import numpy as np

Feeds = dict[str, np.ndarray]


class Runner(abc.ABC):
    """One backend running one artifact."""

    backend: str
    artifact: str

    def activate(self) -> None:  # noqa: B027 - optional hook, most runners need no setup
        """Acquire what inference needs (sessions, engines); called once before ``infer``."""

    @abc.abstractmethod
    def infer(self, feeds: Feeds) -> Feeds:
        """Run one inference."""

    def deactivate(self) -> None:  # noqa: B027 - optional hook
        """Release what ``activate`` acquired."""

    def __enter__(self) -> Runner:
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()
