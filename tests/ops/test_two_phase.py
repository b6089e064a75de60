"""Gold check (docs/parity.md#gold-checks): the two-phase merge (docs/models.md#two-phase-inference) equals the
direct softmax over all sources."""

from __future__ import annotations

import torch

from attnres_export.ops import attnres_aggregate
from attnres_export.ops.two_phase import phase1, phase2


def test_two_phase_merge_equals_direct_softmax_over_blocks_and_partial():
    gen = torch.Generator().manual_seed(11)
    d, eps = 96, 1e-6
    blocks = [torch.randn(3, 5, d, generator=gen) * (1 + i) for i in range(4)]
    queries = [torch.randn(d, generator=gen) * 0.3 for _ in range(3)]
    partial = torch.randn(3, 5, d, generator=gen)
    for (mixed, lse), sw in zip(phase1(queries, blocks, eps), queries, strict=True):
        merged = phase2(sw, partial, mixed, lse, eps)
        direct = attnres_aggregate(sw, [*blocks, partial], eps)
        torch.testing.assert_close(merged, direct, rtol=1e-5, atol=1e-6)
