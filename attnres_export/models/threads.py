"""One intra-op thread for loops over many tensors that only stream memory (docs/exporter-notes.md#weights-io).

Each torch op over a tensor above torch's grain size opens a parallel region, and its threads meet at a barrier at
the end. A pass that reads or copies a model's weights (the NaN/infinity check, the transposes the staged data file
is written with) is bound by memory bandwidth, so a second thread buys nothing, and on a machine with more runnable
threads than cores the barrier waits for a descheduled thread once per tensor: the pass over a 48-layer model's 629
tensors measured 0.2 to 3.9 s with 2 threads and 0.08 to 0.14 s with one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run the block with one torch intra-op thread, restoring the caller's count after it."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
