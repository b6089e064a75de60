"""The self-test's tables as data, and a plain-text rendering of them.

The self-test runs as ``python -m attnres_export.plugins.selftest`` on GPU machines that may have nothing but
torch, and the library layers do not render with rich (the command line does): a table is a title, columns and
rows of strings, printed here as aligned text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TextTable:
    """A titled table of strings; ``right`` names the columns aligned to the right (numbers)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: frozenset[str] = frozenset()

    @property
    def row_count(self) -> int:
        return len(self.rows)


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = ()) -> TextTable:
    """A TextTable; every row must have one cell per column."""
    cells = tuple(tuple(row) for row in rows)
    for row in cells:
        if len(row) != len(columns):
            raise ValueError(f"table {title!r}: row {row} has {len(row)} cells for {len(columns)} columns")
    return TextTable(title, tuple(columns), cells, frozenset(right))


def render_text(data: TextTable) -> str:
    """The title, then the header, a rule and the rows, each column as wide as its widest cell."""
    widths = [max([len(c), *(len(row[i]) for row in data.rows)]) for i, c in enumerate(data.columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.rjust(w) if column in data.right else cell.ljust(w)
                         for cell, w, column in zip(cells, widths, data.columns, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([data.title, line(data.columns), rule, *(line(row) for row in data.rows)])
