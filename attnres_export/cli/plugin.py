"""``attnres plugin ...``: build the native libraries and say where they are."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import command, console, plugin_app
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
    out: Annotated[Path | None, typer.Option(help="Output folder [the per-hash cache].")] = None,
    kernels_only: Annotated[bool, typer.Option(help="Build only libattnres_kernels.so.")] = False,
) -> None:
    """Compile the libraries (cached: an unchanged build returns at once)."""
    from attnres_export.cli.render import table_of
    from attnres_export.plugins.build import build_plugins

    result = build_plugins(out_dir=out, tensorrt_root=tensorrt_root, cuda_archs=cuda_arch, kernels_only=kernels_only,
                           tensorrt_lib=tensorrt_lib)
    rows = [(name, str(path), USAGE[name]) for name, path in result.libraries().items()]
    console.print(table_of("attnres plugin libraries", ("library", "path", "load with"), rows))
    if kernels_only:
        headers = "TensorRT: skipped (--kernels-only)"
    elif result.tensorrt_include is None:
        headers = "TensorRT: no include dir with NvInfer.h found; TensorRT libraries skipped (pass --tensorrt-root)"
    else:
        headers = (f"TensorRT include dir: {result.tensorrt_include} "
                   f"(headers {result.tensorrt_version or 'unknown version'}), linked {result.nvinfer}")
    console.print(headers, highlight=False)
    console.print(f"CUDA archs: {result.cuda_archs}, {result.nvcc_version or 'nvcc'}"
                  f"{' (cached)' if result.cached else ''}", highlight=False)


@command(plugin_app, name="path")
def path() -> None:
    """Print the paths of the most recently built libraries."""
    from attnres_export.plugins.build import find_libraries

    result = find_libraries()
    if result is None:
        raise PluginBuildError("no plugin libraries built yet: run `attnres plugin build`")
    for name, library in result.libraries().items():
        console.print(f"{name}\t{library}", highlight=False, soft_wrap=True)
