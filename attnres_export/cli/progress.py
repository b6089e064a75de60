"""How long work shows its progress: a spinner on a terminal; anywhere else (a pipe, a log file, CI) each new status
as a line on stderr after the minutes and seconds since the work started, as ``attnres plugin build`` prints its
steps, so that a piped export of a large model is not silent for minutes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

from rich.markup import escape

from attnres_export.cli.framework import console, err_console

PROGRESS_ENV = "ATTNRES_PROGRESS"
"""``off``: neither spinner nor lines (the tests set it: a refusal after some progress stays one line there)."""


@contextlib.contextmanager
def progress(text: str) -> Iterator[Callable[[str], None]]:
    """Show ``text`` until the block ends; yields the function that replaces it with a new status."""
    if os.environ.get(PROGRESS_ENV, "").lower() == "off":
        yield lambda _status: None
    elif console.is_terminal:
        with console.status(escape(text)) as spinner:
            yield lambda status: spinner.update(escape(status))
    else:
        yield _lines(text)


def timed_line(started: float, status: str) -> str:
    """``status`` after the minutes and seconds since ``started`` (``time.monotonic``), as a progress line prints."""
    elapsed = int(time.monotonic() - started)
    return f"{elapsed // 60}:{elapsed % 60:02d} {status}"


def _lines(first: str) -> Callable[[str], None]:
    started = time.monotonic()
    last: str | None = None

    def show(status: str) -> None:
        nonlocal last
        if status == last:
            return
        last = status
        err_console.print(escape(timed_line(started, status)))

    show(first)
    return show
