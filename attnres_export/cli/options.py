"""Options shared by several commands, and the parsers of their string forms: each is written once here.

Parsing happens inside the command (not in typer's parser hook) so that a bad value goes through the one error
path: one line naming the option, exit 1.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.dims import DimRange
from attnres_export.dtypes import INPUT_DTYPES, STORAGE_TYPES, Tolerance
from attnres_export.errors import AttnresError

MAX_DIM = 1 << 20
"""Largest batch or sequence a range may ask for: beyond it a profile or a check shape cannot be allocated."""

Seed = Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Seed of the random inputs.")]
Tol = Annotated[list[str] | None, typer.Option(help="Override a pass bar: DTYPE:rel_l2:cosine (repeatable).")]
Shapes = Annotated[list[str] | None, typer.Option(help="B,T shape to run (repeatable) [from the artifact].")]
Plugin = Annotated[Path | None, typer.Option(help="Plugin library [from the engine manifest, else the latest build].")]
ReportPath = Annotated[Path | None, typer.Option("--report", help="Write the report as JSON here.")]
ExampleShape = Annotated[list[str] | None, typer.Option(
    "--example-shape", help="Foreign models: an input's shape NAME:d0,d1,...[:DTYPE] (repeatable).")]
AllowEngineHostCode = Annotated[bool, typer.Option(
    help="Allow engine host code (engines built with --embed-plugin): runs code serialized inside the engine; "
         "only for engines you built or trust.")]
Strict = Annotated[bool, typer.Option(
    "--strict", help="Foreign models: fail (write nothing) when a depth aggregation is left unfused.")]
Vocab = Annotated[int | None, typer.Option(
    min=1, help="Foreign models: integer inputs are drawn from [0, VOCAB) [the size of the table they index, else 2].")]


def parse_range(text: str | None, option: str, lowest: int = 1) -> DimRange | None:
    """``MIN:OPT:MAX`` (or ``N`` for ``N:N:N``) given to ``--OPTION``, MIN at least ``lowest`` (0 for a past
    length: a prefill has none); None stays None."""
    if text is None:
        return None
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise AttnresError(f"--{option} {text!r}: expected MIN:OPT:MAX with whole numbers, e.g. 1:8:64")
    lo, opt, hi = values
    if not lowest <= lo <= opt <= hi:
        raise AttnresError(f"--{option} {text!r}: need {lowest} <= MIN <= OPT <= MAX")
    if hi > MAX_DIM:
        raise AttnresError(f"--{option} {text!r}: MAX is over {MAX_DIM}; ask for a range a device can hold")
    return DimRange(lo, opt, hi)


def parse_tolerances(texts: list[str] | None) -> dict[str, Tolerance]:
    """``--tol NAME:rel_l2:cosine`` values (NAME a storage dtype) -> overrides per dtype."""
    overrides = {}
    for text in texts or []:
        parts = text.split(":")
        try:
            name, rel, cos = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise AttnresError(f"--tol {text!r}: expected NAME:rel_l2:cosine, e.g. float16:5e-3:0.9999") from None
        if len(parts) != 3 or name not in STORAGE_TYPES:
            raise AttnresError(f"--tol {text!r}: NAME must be one of {', '.join(STORAGE_TYPES)}")
        if not (math.isfinite(rel) and rel >= 0 and 0 <= cos <= 1):
            raise AttnresError(f"--tol {text!r}: need a finite rel_l2 >= 0 and 0 <= cosine <= 1")
        overrides[name] = Tolerance(rel, cos)
    return overrides


def parse_shapes(texts: list[str] | None) -> list[tuple[int, int]]:
    """``--shapes B,T`` values -> (B, T) pairs."""
    shapes = []
    for text in texts or []:
        try:
            batch, seq = (int(p) for p in text.split(","))
        except ValueError:
            raise AttnresError(f"--shapes {text!r}: expected B,T with whole numbers, e.g. 2,64") from None
        if not (1 <= batch <= MAX_DIM and 1 <= seq <= MAX_DIM):
            raise AttnresError(f"--shapes {text!r}: B and T must be between 1 and {MAX_DIM}")
        shapes.append((batch, seq))
    return shapes


def parse_example_shapes(texts: list[str] | None) -> dict[str, tuple[list[int], str]]:
    """``--example-shape NAME:d0,d1,...[:DTYPE]`` values -> NAME -> (dims, dtype)."""
    shapes = {}
    for text in texts or []:
        parts = text.split(":")
        dtype = parts[2] if len(parts) == 3 else "float32"
        try:
            dims = [int(d) for d in parts[1].split(",")]
        except (IndexError, ValueError):
            dims = []
        if len(parts) not in (2, 3) or not parts[0] or not dims or min(dims) < 1 or dtype not in INPUT_DTYPES:
            raise AttnresError(f"--example-shape {text!r}: expected NAME:d0,d1,...[:DTYPE] with DTYPE one of "
                               f"{', '.join(INPUT_DTYPES)}, e.g. input_ids:2,16:int64")
        shapes[parts[0]] = (dims, dtype)
    return shapes


def file_size(files: list[Path]) -> str:
    """Total size of ``files`` for messages."""
    total = sum(f.stat().st_size for f in files)
    return f"{total / 1e6:.1f} MB" if total >= 1e5 else f"{total / 1e3:.1f} kB"
