"""The ``attnres`` command line (typer); ``attnres-export`` is ``attnres export``.

Each command lives in its own module of this package and registers itself on ``app`` when imported.
"""

from attnres_export.cli import bench, build, check, convert, example, export, fuse, inspect
from attnres_export.cli._app import app, export_app
from attnres_export.plugins.cli import plugin_app

app.add_typer(plugin_app, name="plugin", help="Build and locate the CUDA/TensorRT plugin libraries.")


def export_main() -> None:
    """Entry point of ``attnres-export``."""
    export_app(prog_name="attnres-export")


__all__ = ["app", "bench", "build", "check", "convert", "example", "export", "export_app", "export_main", "fuse",
           "inspect"]
