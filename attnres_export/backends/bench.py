"""Latency of one artifact, or of two in alternation: warm-up first, then one timed step per iteration.

A GPU step is timed with CUDA events on its own stream (what the GPU spent, not Python's overhead); a CPU
step with perf_counter, and the table says which clock measured what. Alternating two artifacts exposes
both to the same clocks, thermals and neighbours, so their ratio is fairer than two separate runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner


class HostClock:
    """Wall time of a synchronous step."""

    name = "perf_counter (host)"

    def measure(self, step: Callable[[], None]) -> float:
        start = time.perf_counter()
        step()
        return (time.perf_counter() - start) * 1e3


class CudaEventClock:
    """GPU time between two events recorded around an asynchronous step on ``stream``."""

    name = "CUDA events"

    def __init__(self, stream) -> None:
        import torch

        self.torch = torch
        self.stream = stream

    def measure(self, step: Callable[[], None]) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        step()
        end.record(self.stream)
        end.synchronize()
        return float(start.elapsed_time(end))


@dataclass
class Workload:
    """One artifact at one shape, ready to step."""

    artifact: str
    backend: str
    shape: tuple[int, int]
    step: Callable[[], None]
    clock: HostClock | CudaEventClock
    latencies_ms: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q))

    def throughput(self) -> tuple[float, float]:
        """(sequences/s, tokens/s) at the median latency."""
        seconds = self.percentile(50) / 1e3
        batch, seq = self.shape
        return batch / seconds, batch * seq / seconds


def ort_workload(runner: OnnxRuntimeRunner, feeds: dict[str, np.ndarray], shape: tuple[int, int]) -> Workload:
    """ONNX Runtime's ``run`` (host inputs and outputs included), timed on the host."""
    backend = runner.backend + ("" if "CUDAExecutionProvider" in runner.providers else " (CPU)")
    return Workload(runner.artifact, backend, shape, lambda: runner.infer(feeds), HostClock())


def tensorrt_workload(runner, feeds: dict[str, np.ndarray], shape: tuple[int, int], cuda_graph: bool) -> Workload:
    """``execute_async_v3`` on bound device buffers, optionally replayed from a captured CUDA graph.

    The graph replays on ``runner.stream``, where the clock records its events: ``CUDAGraph.replay`` launches on
    the current stream, which would otherwise be the default one, and the events would time an empty stream.
    """
    import torch

    runner.bind(feeds)
    step = runner.enqueue
    backend = runner.backend
    if cuda_graph:
        runner.enqueue()
        runner.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=runner.stream):
            runner.enqueue()

        def step() -> None:
            with torch.cuda.stream(runner.stream):
                graph.replay()

        backend += "+cuda-graph"
    return Workload(runner.artifact, backend, shape, step, CudaEventClock(runner.stream))


def measure(workloads: Sequence[Workload], iterations: int, warmup: int) -> None:
    """Warm every workload up, then time them in alternation (``iterations`` steps each)."""
    for workload in workloads:
        for _ in range(warmup):
            workload.clock.measure(workload.step)
    for _ in range(iterations):
        for workload in workloads:
            workload.latencies_ms.append(workload.clock.measure(workload.step))


def ratio_lines(pairs: Sequence[Sequence[Workload]]) -> list[str]:
    """Per shape: the second artifact's median latency over the first's (>1: the second is slower)."""
    return [f"{b.artifact} / {a.artifact} at {'x'.join(map(str, a.shape))}: "
            f"{b.percentile(50) / a.percentile(50):.3f}x median latency" for a, b in pairs]
