"""The ``attnres`` command line's one path: the typer apps, the consoles, and the ``command`` decorator that
gives every command (``attnres plugin ...`` included) the same ``--debug`` option and the same error handling.

An ``AttnresError`` (or any other failure) becomes one line on stderr and exit 1; a usage error (a parser's, or
``usage_error`` raised by a command) one line and exit 2, under the console scripts and typer's test runner
alike; Ctrl-C exit 130 and SIGTERM exit 143, both after the temporary files are removed (docs/security.md).
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Union, get_args, get_origin

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from attnres_export import __version__
from attnres_export.errors import AttnresError

console = Console()
if not console.is_terminal and "COLUMNS" not in os.environ:
    console = Console(width=160)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
_state: dict = {"debug": False, "signal": None}


class _OneLineErrors:
    """A usage error is one line and exit 2 wherever the command line runs: the console scripts (``run``, which
    calls ``main`` in non-standalone mode and handles signals) and a standalone ``main`` (typer's test runner)."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except Exception as exc:
            code = _usage_error(exc)
        sys.exit(code if isinstance(code, int) else 0)


class OneLineGroup(_OneLineErrors, TyperGroup):
    pass


class OneLineCommand(_OneLineErrors, TyperCommand):
    """A command whose help reads as docs/cli.md writes it: ``attnres fuse [OPTIONS] MODEL`` (not ``{model}``),
    values named ``PATH``, ``N``, ``X`` or ``TEXT`` (not ``<list[Path]>``), number ranges in words (not
    ``0<=x<=9223372036854775807``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        annotations = {name: p.annotation for name, p in inspect.signature(self.callback).parameters.items()}
        for param in self.params:
            if param.param_type_name == "argument":
                param.metavar = param.name.upper()
            elif param.metavar is None and not getattr(param, "is_flag", False):
                param.metavar = VALUE_NAMES.get(_value_type(annotations.get(param.name)))
            low, high = getattr(param, "min", None), getattr(param, "max", None)
            if low is not None or high is not None:
                param.min = param.max = None  # typer prints them as 0<=x<=...; the help says the range instead
                text = (param.help or "").rstrip(".")
                param.help = f"{text} ({readable_range(low, high)})." if text else f"{readable_range(low, high)}."

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        """``[OPTIONS] MODEL [EXTRA]...``: arguments by their names, optional ones in brackets."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar if param.required else f"[{param.metavar}]"
                pieces.append(name if param.nargs == 1 else f"{name}...")
        return pieces


VALUE_NAMES = {Path: "PATH", int: "N", float: "X", str: "TEXT"}
"""What an option's value is called in ``--help`` when the option names no metavar of its own."""


def _value_type(annotation: object) -> object:
    """The type of one value of an option annotated ``annotation`` (``Annotated[list[Path] | None, ...]`` -> Path)."""
    while True:
        if get_origin(annotation) is Annotated or get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
        elif isinstance(annotation, types.UnionType) or get_origin(annotation) is Union:
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def readable_range(low: float | None, high: float | None) -> str:
    """``0 to 2^63-1``, ``at least 1``, ``18 to 23``: a number range as a person writes it."""

    def number(value: float) -> str:
        power = int(value + 1).bit_length() - 1 if isinstance(value, int) and value > 0 else 0
        return f"2^{power}-1" if power > 20 and value + 1 == 1 << power else f"{value}"

    if high is None:
        return f"at least {number(low)}"
    if low is None:
        return f"at most {number(high)}"
    return f"{number(low)} to {number(high)}"


_STYLE = {"pretty_exceptions_enable": False, "add_completion": False, "rich_markup_mode": None}
"""One help style for every app (``attnres-export --help`` reads like ``attnres export --help``)."""
app = typer.Typer(help="Export attention-residual transformers to ONNX/TensorRT, verified against PyTorch.",
                  no_args_is_help=True, cls=OneLineGroup, **_STYLE)
export_app = typer.Typer(help="Export an attnres checkpoint to ONNX.", **_STYLE)
plugin_app = typer.Typer(help="Build and locate the CUDA/TensorRT plugin libraries.", no_args_is_help=True,
                         cls=OneLineGroup, **_STYLE)
app.add_typer(plugin_app, name="plugin")

def debugging() -> bool:
    """Did the command line ask for ``--debug`` (before or after the command's name)?"""
    return bool(_state["debug"])


DebugOption = Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")]
_DEBUG = inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=DebugOption)


def _print_version(wanted: bool) -> None:
    if wanted:
        console.print(f"attnres-export {__version__}", highlight=False)
        raise typer.Exit()


VersionOption = Annotated[bool, typer.Option(
    "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")]


@app.callback()
def _main(debug: DebugOption = False, version: VersionOption = False) -> None:
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
                _interrupted()
            except Exception as exc:
                if _state["debug"] or _is_usage_error(exc):
                    raise
                if _state["signal"] is not None:
                    _interrupted()
                fail(_one_line(exc))

        signature = inspect.signature(fn, eval_str=True)
        run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), _DEBUG])
        for target in apps:
            target.command(name, cls=OneLineCommand)(run)
        return run

    return register


def _on_signal(signum: int, _frame) -> None:
    """SIGINT and SIGTERM both unwind the command like Ctrl-C, so every ``finally`` removes its temporaries."""
    _state["signal"] = signum
    raise KeyboardInterrupt


def _interrupted() -> None:
    """Exit 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).

    An interrupt can also surface as another exception, e.g. an AttributeError from a module whose import it cut
    short; once a signal arrived, any failure is reported as the interruption."""
    signum = _state["signal"] or signal.SIGINT
    err_console.print(f"interrupted ({signal.Signals(signum).name}); no partial output was left behind")
    raise typer.Exit(128 + signum)


def run(application: typer.Typer, prog_name: str) -> None:
    """Run a typer app as a console script: signals handled, usage errors as one line with exit 2."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        code = typer.main.get_command(application).main(prog_name=prog_name, standalone_mode=False)
    except KeyboardInterrupt:
        code = 128 + (_state["signal"] or signal.SIGINT)
    except Exception as exc:
        code = _usage_error(exc)
    sys.exit(code if isinstance(code, int) else 0)


def _is_usage_error(exc: Exception) -> bool:
    """A command-line parser's error, recognised by shape (``format_message`` and ``exit_code``), as click and the
    copy of click typer vendors both raise them."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def usage_error(option: str, message: str) -> typer.BadParameter:
    """A usage error (exit 2) found by a command itself, e.g. two options that exclude each other."""
    return typer.BadParameter(message, param_hint=f"'{option}'")


def _usage_error(exc: Exception) -> int:
    """Print a command-line parser's error as one line and return its exit code (2); re-raise anything else."""
    code, ctx = getattr(exc, "exit_code", None), getattr(exc, "ctx", None)
    if not _is_usage_error(exc):
        raise exc
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        console.print(ctx.get_help())
        return code
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    err_console.print(f"[red]error:[/red] {escape(exc.format_message())}{escape(where)}")
    return code


def _one_line(exc: Exception) -> str:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, AttnresError):
        return message
    return f"{type(exc).__name__}: {message} (run with --debug for the traceback)"


def fail(message: str) -> None:
    """Print ``error: message`` on stderr and exit 1."""
    err_console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)
