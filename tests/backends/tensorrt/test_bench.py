"""Benchmark statistics and the bench command on ONNX Runtime CPU (no timing assertions)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import onnx
from typer.testing import CliRunner

from attnres_export.backends.bench import HostClock, Workload, measure, ratio_lines, tensorrt_workload
from attnres_export.cli import app
from tests.backends.tensorrt.graphs import token_model


def workload(latencies: list[float], artifact: str = "a") -> Workload:
    return Workload(artifact, "test", (4, 32), lambda: None, HostClock(), list(latencies))


def test_percentiles_and_throughput_come_from_the_recorded_latencies():
    w = workload([float(i) for i in range(1, 101)])
    assert w.percentile(50) == 50.5 and round(w.percentile(90), 2) == 90.1 and round(w.percentile(99), 2) == 99.01
    sequences, tokens = w.throughput()
    assert sequences == 4 / 0.0505 and tokens == 4 * 32 / 0.0505


def test_measure_alternates_workloads_after_the_warm_up():
    order: list[str] = []
    a = Workload("a", "t", (1, 1), lambda: order.append("a"), HostClock())
    b = Workload("b", "t", (1, 1), lambda: order.append("b"), HostClock())
    measure([a, b], iterations=3, warmup=1)
    assert order == ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert len(a.latencies_ms) == len(b.latencies_ms) == 3


def test_ratio_is_the_second_median_over_the_first():
    (line,) = ratio_lines([(workload([2.0]), workload([3.0], "b"))])
    assert line == "b / a at 4x32: 1.500x median latency"


def test_bench_cli_times_onnx_on_cpu_and_compares_two_artifacts(tmp_path):
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(token_model(), str(first))
    onnx.save(token_model(), str(second))
    result = CliRunner().invoke(app, ["bench", str(first), "--compare", str(second), "--iterations", "3",
                                      "--warmup", "1", "--shapes", "2,4", "--shapes", "1,8"])
    assert result.exit_code == 0, result.output
    assert "perf_counter (host)" in result.output and "(CPU)" in result.output
    assert "b.onnx / a.onnx at 2x4" in result.output and "b.onnx / a.onnx at 1x8" in result.output


def test_cuda_graph_replays_on_the_runners_stream_where_the_clock_records_its_events(monkeypatch):
    import torch

    current, launches = ["default stream"], []

    @contextmanager
    def on_stream(stream):
        previous, current[0] = current[0], stream
        yield
        current[0] = previous

    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, stream: on_stream(stream))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: SimpleNamespace(
        replay=lambda: launches.append(("replay", current[0]))))
    stream = SimpleNamespace(synchronize=lambda: None)
    runner = SimpleNamespace(artifact="m.engine", backend="tensorrt", stream=stream, bind=lambda feeds: None,
                             enqueue=lambda: launches.append(("enqueue", current[0])))
    workload = tensorrt_workload(runner, {}, (1, 8), cuda_graph=True)
    workload.step()
    assert launches[-1] == ("replay", stream) and workload.clock.stream is stream
    assert workload.backend == "tensorrt+cuda-graph"
