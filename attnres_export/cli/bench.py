"""``attnres bench``: latency and throughput of an engine or an ONNX, optionally against another artifact."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console
from attnres_export.cli.options import AllowEngineHostCode, Plugin, Shapes, parse_shapes
from attnres_export.cli.progress import progress
from attnres_export.errors import AttnresError


@command(app)
def bench(
    artifact: Annotated[Path, typer.Argument(help="TensorRT engine, or ONNX (run on ONNX Runtime).")],
    shapes: Shapes = None,
    iterations: Annotated[int, typer.Option(help="Timed iterations per shape.")] = 100,
    warmup: Annotated[int, typer.Option(help="Untimed iterations first.")] = 10,
    cuda_graph: Annotated[bool, typer.Option(help="Replay engines from a captured CUDA graph.")] = False,
    compare: Annotated[Path | None, typer.Option(help="Another engine/ONNX, timed in alternation.")] = None,
    plugin: Plugin = None,
    allow_engine_host_code: AllowEngineHostCode = False,
) -> None:
    """Median, p90 and p99 latency and throughput (CUDA events for engines, perf_counter for ONNX Runtime)."""
    from attnres_export.backends.bench import measure, ratio_lines
    from attnres_export.backends.tensorrt.manifest import manifest_path, read_manifest
    from attnres_export.cli.render import bench_table

    if iterations < 1 or warmup < 0:
        raise AttnresError("--iterations must be >= 1 and --warmup >= 0")
    wanted_shapes = parse_shapes(shapes)
    if not wanted_shapes and artifact.suffix != ".onnx" and read_manifest(artifact) is None:
        raise AttnresError(f"{artifact.name} has no manifest {manifest_path(artifact).name} recording its shapes "
                           "(an engine not built by `attnres build`); pass --shapes B,T")
    paths = [artifact] + ([compare] if compare else [])
    with ExitStack() as stack:
        opened = [stack.enter_context(_Opened(p, plugin, allow_engine_host_code)) for p in paths]
        run_shapes = wanted_shapes or [opened[0].default_shape()]
        per_shape = []
        with progress(f"timing {iterations} iterations after {warmup} warm-up"):
            for shape in run_shapes:
                per_shape.append([o.workload(shape, cuda_graph) for o in opened])
                measure(per_shape[-1], iterations, warmup)
    console.print(bench_table([w for group in per_shape for w in group]))
    if compare:
        for line in ratio_lines(per_shape):
            console.print(line, highlight=False)


class _Opened:
    """An activated runner for an artifact, and how to feed and time it."""

    def __init__(self, path: Path, plugin: Path | None, allow_engine_host_code: bool) -> None:
        self.path = path
        self.plugin = plugin
        self.allow_engine_host_code = allow_engine_host_code

    def __enter__(self) -> _Opened:
        from attnres_export.backends.factory import engine_runner, onnx_runner
        from attnres_export.backends.onnxruntime.runner import cuda_provider_available
        from attnres_export.graphs.metadata import export_info, input_axes

        if self.path.suffix == ".onnx":
            self.runner, _, model = onnx_runner(self.path, "cuda" if cuda_provider_available() else "cpu")
            info = export_info(model)
            self.dims = info.get("dims", {})
            labels = info.get("inputs", {})
            self.axes = {name: [labels[name][i] if isinstance(d, str) and name in labels else d
                                for i, d in enumerate(dims)] for name, dims in input_axes(model).items()}
            self.types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
        else:
            self.runner, _ = engine_runner(self.path, self.plugin, self.allow_engine_host_code)
            self.dims = self.runner.manifest.dims if self.runner.manifest is not None else {}
            self.axes = self.runner.input_axes()
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
        from attnres_export.backends.bench import ort_workload, tensorrt_workload

        if self.path.suffix == ".onnx":
            return ort_workload(self.runner, self.feeds(shape), shape)
        return tensorrt_workload(self.runner, self.feeds(shape), shape, cuda_graph)
