"""Shared pieces of the ``attnres`` command line: the typer apps, consoles and one-line error handling.

Every command turns an ``AttnresError`` (or any other failure) into one line on stderr and a non-zero exit;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from attnres_export.errors import AttnresError

console = Console()
if not console.is_terminal:
    console = Console(width=160)
err_console = Console(stderr=True)
_state = {"debug": False}

app = typer.Typer(help="Export attention-residual transformers to ONNX/TensorRT, verified against PyTorch.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
export_app = typer.Typer(help="Export an attnres checkpoint to ONNX.", pretty_exceptions_enable=False,
                         add_completion=False)


def set_debug(debug: bool) -> None:
    _state["debug"] = debug


DebugOption = Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")]


@app.callback()
def _main(debug: DebugOption = False) -> None:
    set_debug(debug)


def friendly_errors(fn):
    """One-line errors, exit 1 (130 on Ctrl-C); full traceback only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except KeyboardInterrupt:
            err_console.print("interrupted; no partial output was left behind")
            raise typer.Exit(130) from None
        except Exception as exc:
            if _state["debug"]:
                raise
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if not isinstance(exc, AttnresError):
                message = f"{type(exc).__name__}: {message} (run with --debug for the traceback)"
            err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def file_size(files: list[Path]) -> str:
    """Total size of ``files`` for messages."""
    total = sum(f.stat().st_size for f in files)
    return f"{total / 1e6:.1f} MB" if total >= 1e5 else f"{total / 1e3:.1f} kB"
