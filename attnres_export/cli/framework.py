"""The ``attnres`` command line's one path: the typer apps, the consoles, and the ``command`` decorator that
gives every command (``attnres plugin ...`` included) the same ``--debug`` option and the same error handling.

An ``AttnresError`` (or any other failure) becomes one line on stderr and exit 1, Ctrl-C exit 130; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console

from attnres_export.errors import AttnresError

console = Console()
if not console.is_terminal:
    console = Console(width=160)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
_state = {"debug": False}

app = typer.Typer(help="Export attention-residual transformers to ONNX/TensorRT, verified against PyTorch.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
export_app = typer.Typer(help="Export an attnres checkpoint to ONNX.", pretty_exceptions_enable=False,
                         add_completion=False)
plugin_app = typer.Typer(help="Build and locate the CUDA/TensorRT plugin libraries.", no_args_is_help=True,
                         pretty_exceptions_enable=False, add_completion=False)
app.add_typer(plugin_app, name="plugin")

DebugOption = Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")]
_DEBUG = inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=DebugOption)


@app.callback()
def _main(debug: DebugOption = False) -> None:
    _state["debug"] = debug


def command(*apps: typer.Typer, name: str | None = None) -> Callable[[Callable], Callable]:
    """Register ``fn`` as a command of ``apps`` with ``--debug`` and one-line errors (exit 1, 130 on Ctrl-C)."""

    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, debug: bool = False, **kwargs):
            _state["debug"] = _state["debug"] or debug
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
                fail(_one_line(exc))

        signature = inspect.signature(fn, eval_str=True)
        run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), _DEBUG])
        for target in apps:
            target.command(name)(run)
        return run

    return register


def _one_line(exc: Exception) -> str:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, AttnresError):
        return message
    return f"{type(exc).__name__}: {message} (run with --debug for the traceback)"


def fail(message: str) -> None:
    """Print ``error: message`` on stderr and exit 1."""
    err_console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(1)
