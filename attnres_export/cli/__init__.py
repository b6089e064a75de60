"""The ``attnres`` command line (typer); ``attnres-export`` is ``attnres export``.

Each command lives in its own module of this package and registers itself through ``app.command`` when
imported; ``framework.py`` holds the one error path and ``options.py`` the options several commands share.
"""

import gc

from attnres_export.cli import (
    bench,
    build,
    check,
    convert,
    convert_checkpoint,
    example,
    export,
    fuse,
    generate,
    inspect,
    plugin,
    serve,
    triton_repo,
)
from attnres_export.cli.framework import app, export_app, run


def main() -> None:
    """Entry point of ``attnres``."""
    try:
        run(app, "attnres")
    finally:
        _exiting()


def export_main() -> None:
    """Entry point of ``attnres-export``."""
    try:
        run(export_app, "attnres-export")
    finally:
        _exiting()


def _exiting() -> None:
    """The console script ends here: move every object alive to the collector's permanent generation
    (``gc.freeze``), so that the interpreter's teardown frees them by reference count instead of walking them in
    each of its collections (after an export, with torch's 400,000-odd objects, 2-3 s of a 10 s process; 0.4 s
    frozen; docs/benchmarks.md#cpu-commands-as-whole-processes-benchmarkscommand_latencypy). Nothing else changes:
    the exit code, ``atexit`` handlers and finalizers run as before."""
    gc.freeze()


__all__ = [
    "app",
    "bench",
    "build",
    "check",
    "convert",
    "convert_checkpoint",
    "example",
    "export",
    "export_app",
    "export_main",
    "fuse",
    "generate",
    "inspect",
    "main",
    "plugin",
    "serve",
    "triton_repo",
]
