"""``attnres plugin ...``: build the native libraries and say where they are."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from attnres_export.plugins.build import BuildResult, PluginBuildError, build_plugins, find_libraries

plugin_app = typer.Typer(
    name="plugin",
    help="Build the CUDA kernels and TensorRT plugin libraries on this machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_out = Console()
_err = Console(stderr=True, highlight=False)


def _fail(message: str) -> typer.Exit:
    _err.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    return typer.Exit(code=1)


def _library_table(result: BuildResult) -> Table:
    table = Table(title="attnres plugin libraries")
    table.add_column("library")
    table.add_column("path", overflow="fold")
    table.add_column("load with")
    usage = {
        "kernels": "ctypes.CDLL (C ABI, no TensorRT)",
        "trt": "ctypes.CDLL / Polygraphy --plugins / trtexec --staticPlugins",
        "trt_dyn": "IPluginRegistry.load_library / trtexec --dynamicPlugins",
    }
    for name, path in result.libraries().items():
        table.add_row(name, str(path), usage[name])
    return table


def _tensorrt_line(result: BuildResult, kernels_only: bool) -> str:
    if kernels_only:
        return "TensorRT: skipped (--kernels-only)"
    if result.tensorrt_include is None:
        return "TensorRT: no include dir with NvInfer.h found; TensorRT libraries skipped (pass --tensorrt-root)"
    return f"TensorRT include dir: {result.tensorrt_include} (headers {result.tensorrt_version or 'unknown version'})"


@plugin_app.command("build")
def build_command(
    tensorrt_root: Annotated[
        Path | None, typer.Option("--tensorrt-root", help="TensorRT folder holding include/NvInfer.h")
    ] = None,
    cuda_arch: Annotated[
        str | None, typer.Option("--cuda-arch", help='CUDA architectures, e.g. "80;86;89;90" (default adds PTX 90)')
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: the per-hash cache)")] = None,
    kernels_only: Annotated[bool, typer.Option("--kernels-only", help="Build only libattnres_kernels.so")] = False,
) -> None:
    """Compile the libraries (cached: an unchanged build returns at once)."""
    try:
        result = build_plugins(
            out_dir=out, tensorrt_root=tensorrt_root, cuda_archs=cuda_arch, kernels_only=kernels_only
        )
    except PluginBuildError as exc:
        raise _fail(str(exc)) from None
    _out.print(_library_table(result))
    _out.print(_tensorrt_line(result, kernels_only), highlight=False)
    _out.print(f"CUDA archs: {result.cuda_archs}{' (cached)' if result.cached else ''}", highlight=False)


@plugin_app.command("path")
def path_command() -> None:
    """Print the paths of the most recently built libraries."""
    result = find_libraries()
    if result is None:
        raise _fail("no plugin libraries built yet: run `attnres plugin build`")
    for name, path in result.libraries().items():
        _out.print(f"{name}\t{path}", highlight=False, soft_wrap=True)
