"""``attnres plugin ...``: build the native libraries and say where they are."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from attnres_export.cli.framework import command, console, err_console, fail, plugin_app
from attnres_export.cli.progress import timed_line
from attnres_export.errors import PluginBuildError

USAGE = {
    "kernels": "ctypes.CDLL (C ABI, no TensorRT)",
    "trt": "ctypes.CDLL / Polygraphy --plugins / trtexec --staticPlugins",
    "trt_dyn": "IPluginRegistry.load_library / trtexec --dynamicPlugins",
}
"""How each library is loaded."""


@command(plugin_app, name="build")
def build(
    tensorrt_root: Annotated[Path | None, typer.Option(help="TensorRT folder holding include/NvInfer.h.")] = None,
    tensorrt_lib: Annotated[Path | None, typer.Option(
        help="Folder holding libnvinfer.so or libnvinfer.so.<major> (pip: site-packages/tensorrt_libs) "
             "[TENSORRT_ROOT/lib, pip's tensorrt*_libs, the system library folders].")] = None,
    cuda_arch: Annotated[str | None, typer.Option(
        help='CUDA architectures, e.g. "80;90", or "edge" (Jetson Orin 87 + Thor 110) '
             "[80-real;86-real;89-real;90 = A100/A10/L4/H100 SASS plus PTX of 90]; "
             "below 80 (T4, Xavier) is unsupported.")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Output folder: lib/ holds the kernels library, tensorrt-<key>/lib/ the TensorRT libraries "
             "[the cache folder of these sources, architectures and nvcc].")] = None,
    kernels_only: Annotated[bool, typer.Option(
        help="Build only libattnres_kernels.so (the TensorRT libraries reuse the same kernels build).")] = False,
) -> None:
    """Compile the libraries (cached: an unchanged build returns at once); exits 1 when the TensorRT libraries were
    asked for (the default) and not built."""
    from attnres_export.cli.render import table_of
    from attnres_export.plugins.build import build_plugins

    started = time.monotonic()
    with err_console.status("attnres plugin build") as spinner:

        def progress(line: str) -> None:
            err_console.print(escape(timed_line(started, line)))
            spinner.update(escape(line))

        result = build_plugins(out_dir=out, tensorrt_root=tensorrt_root, cuda_archs=cuda_arch,
                               kernels_only=kernels_only, tensorrt_lib=tensorrt_lib, status=progress)
    rows = [(o.file, o.state, escape(str(o.path) if o.path else o.why), USAGE[o.name] if o.path else "")
            for o in result.outcomes]
    console.print(table_of("attnres plugin build", ("library", "result", "path, or why not", "load with"), rows))
    if result.trt is not None:
        console.print(f"TensorRT include dir: {result.tensorrt_include} "
                      f"(headers {result.tensorrt_version or 'unknown version'}), linked {result.nvinfer}",
                      highlight=False, soft_wrap=True)
    console.print(f"CUDA archs: {result.cuda_archs}, {result.nvcc_version or 'nvcc'}; "
                  f"{time.monotonic() - started:.0f}s{' (cached)' if result.cached and not result.not_built else ''}",
                  highlight=False)
    if result.not_built is not None:
        fail(result.not_built)


@command(plugin_app, name="path")
def path() -> None:
    """Print the paths of the most recently built libraries."""
    from attnres_export.plugins.build import find_libraries

    result = find_libraries()
    if result is None:
        raise PluginBuildError("no plugin libraries built yet: run `attnres plugin build`")
    for name, library in result.libraries().items():
        console.print(f"{name}\t{library}", highlight=False, soft_wrap=True)
