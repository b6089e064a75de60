"""The weights' I/O passes run on one torch thread and give the caller its own thread count back."""

from __future__ import annotations

import pytest
import torch

from attnres_export.models.threads import single_threaded


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_single_threaded_runs_on_one_thread_and_restores_the_count_even_after_an_error(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with single_threaded():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == threads
        with pytest.raises(ValueError), single_threaded():
            raise ValueError("inside")
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
