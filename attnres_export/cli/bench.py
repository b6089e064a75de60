"""``attnres bench``: latency and throughput of an engine or an ONNX, optionally against another artifact."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli._app import DebugOption, app, console, friendly_errors, set_debug
from attnres_export.errors import AttnresError


@app.command()
def bench(
    artifact: Annotated[Path, typer.Argument(help="TensorRT engine, or ONNX (run on ONNX Runtime).")],
    shapes: Annotated[list[str] | None, typer.Option(help="B,T shape to time [the opt shape].")] = None,
    iterations: Annotated[int, typer.Option(help="Timed iterations per shape.")] = 100,
    warmup: Annotated[int, typer.Option(help="Untimed iterations first.")] = 10,
    cuda_graph: Annotated[bool, typer.Option(help="Replay engines from a captured CUDA graph.")] = False,
    compare: Annotated[Path | None, typer.Option(help="Another engine/ONNX, timed in alternation.")] = None,
    plugin: Annotated[Path | None, typer.Option(help="Plugin library for engines [from their manifest].")] = None,
    debug: DebugOption = False,
) -> None:
    """Median, p90 and p99 latency and throughput (CUDA events for engines, perf_counter for ONNX Runtime)."""
    if debug:
        set_debug(True)
    _bench(artifact, shapes or [], iterations, warmup, cuda_graph, compare, plugin)


@friendly_errors
def _bench(artifact, shape_texts, iterations, warmup, cuda_graph, compare, plugin) -> None:
    from attnres_export.cli.check import parse_shape
    from attnres_export.engine.bench import measure, ratio_lines, results_table

    if iterations < 1 or warmup < 0:
        raise AttnresError("--iterations must be >= 1 and --warmup >= 0")
    paths = [artifact] + ([compare] if compare else [])
    with ExitStack() as stack:
        opened = [stack.enter_context(_Opened(p, plugin)) for p in paths]
        shapes = [parse_shape(s) for s in shape_texts] or [opened[0].default_shape()]
        per_shape = []
        with console.status(f"timing {iterations} iterations after {warmup} warm-up"):
            for shape in shapes:
                per_shape.append([o.workload(shape, cuda_graph) for o in opened])
                measure(per_shape[-1], iterations, warmup)
    console.print(results_table([w for group in per_shape for w in group]))
    if compare:
        for line in ratio_lines(per_shape):
            console.print(line, highlight=False)


class _Opened:
    """An activated runner for an artifact, and how to feed and time it."""

    def __init__(self, path: Path, plugin: Path | None) -> None:
        self.path = path
        self.plugin = plugin

    def __enter__(self) -> _Opened:
        from attnres_export.engine.onnx_info import export_info, input_axes
        from attnres_export.parity.artifacts import engine_runner, onnx_runner
        from attnres_export.parity.runners import cuda_provider_available

        if self.path.suffix == ".onnx":
            self.runner, _, model = onnx_runner(self.path, "cuda" if cuda_provider_available() else "cpu")
            info = export_info(model)
            self.dims = info.get("dims", {})
            labels = info.get("inputs", {})
            self.axes = {name: [labels[name][i] if isinstance(d, str) and name in labels else d
                                for i, d in enumerate(dims)] for name, dims in input_axes(model).items()}
            self.types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
        else:
            self.runner, _ = engine_runner(self.path, self.plugin)
            self.dims, self.axes = self.runner.manifest.dims, self.runner.manifest.input_axes
        self.runner.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.runner.deactivate()

    def default_shape(self) -> tuple[int, int]:
        if "batch" not in self.dims or "seq" not in self.dims:
            raise AttnresError(f"{self.path.name} records no batch/seq ranges; pass --shapes B,T")
        return self.dims["batch"][1], self.dims["seq"][1]

    def feeds(self, shape: tuple[int, int]) -> dict:
        """Zeros for integer inputs (timing does not depend on token ids), standard normal for float ones."""
        import numpy as np
        from onnx import helper

        sizes = {"batch": shape[0], "seq": shape[1]}
        rng = np.random.default_rng(0)
        feeds = {}
        for name, axes in self.axes.items():
            dims = [sizes.get(a, 1) if isinstance(a, str) else a for a in axes]
            dtype = self._np_dtype(name, helper)
            feeds[name] = (rng.standard_normal(dims).astype(dtype) if np.issubdtype(dtype, np.floating)
                           else np.zeros(dims, dtype=dtype))
        return feeds

    def _np_dtype(self, name: str, helper):
        import numpy as np

        if self.path.suffix == ".onnx":
            return helper.tensor_dtype_to_np_dtype(self.types[name])
        return np.dtype(self.runner.input_dtype(name))

    def workload(self, shape: tuple[int, int], cuda_graph: bool):
        from attnres_export.engine.bench import ort_workload, tensorrt_workload

        if self.path.suffix == ".onnx":
            return ort_workload(self.runner, self.feeds(shape), shape)
        return tensorrt_workload(self.runner, self.feeds(shape), shape, cuda_graph)
