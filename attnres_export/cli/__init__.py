"""The ``attnres`` command line (typer); ``attnres-export`` is ``attnres export``.

Each command lives in its own module of this package and registers itself through ``app.command`` when
imported; ``framework.py`` holds the one error path and ``options.py`` the options several commands share.
"""

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
    run(app, "attnres")


def export_main() -> None:
    """Entry point of ``attnres-export``."""
    run(export_app, "attnres-export")


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
