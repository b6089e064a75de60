"""Options shared by several commands, and the parsers of their string forms: each is written once here.

Closed choices are generated from their one table (``dtypes.STORAGE_TYPES``, ``graphs.target_names``,
``backends.onnxruntime.providers``), and every value is parsed while the command line is read, before any file
is opened or any heavy module imported: a typo or a malformed value is a usage error, one line naming the option,
exit 2 (docs/security.md#exit-codes). This module imports nothing heavy.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.backends.onnxruntime.providers import PROVIDERS
from attnres_export.dims import DimRange
from attnres_export.dtypes import DTYPE_ALIASES, INPUT_DTYPES, STORAGE_TYPES, Tolerance, canonical_dtype
from attnres_export.errors import AttnresError
from attnres_export.graphs.target_names import EXPORT_TARGETS, TARGETS

MAX_DIM = 1 << 20
"""Largest batch or sequence a range may ask for: beyond it a profile or a check shape cannot be allocated."""


def choice(values: Sequence[str], help: str, *names: str, aliases: Mapping[str, str] | None = None):
    """A ``typer.Option`` taking one of ``values`` (listed in ``--help``), or an alias of one; anything else is a
    usage error that lists the choices and the closest one."""
    aliases = dict(aliases or {})

    def parse(text: str) -> str:
        value = aliases.get(text, text)
        if value in values:
            return value
        close = difflib.get_close_matches(text, [*values, *aliases], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        also = f" (or {', '.join(aliases)})" if aliases else ""
        raise typer.BadParameter(f"{text!r} is not one of {', '.join(values)}{also}{hint}")

    spelled = f" ({', '.join(f'{a} = {v}' for a, v in aliases.items())})" if aliases else ""
    return typer.Option(*names, parser=parse, metavar=f"[{'|'.join(values)}]", help=help + spelled)


Dtype = Annotated[str, choice(STORAGE_TYPES, "Storage type of weights and activations.", aliases=DTYPE_ALIASES)]
ExportTarget = Annotated[str, choice(
    EXPORT_TARGETS, "tensorrt keeps one fused attnres node per aggregation; portable decomposes them into standard "
                    "ops; onnxruntime also writes ONNX Runtime's fused ops (attention, experts, KDA, norms) "
                    "(ort-trt: `attnres convert`).")]
Target = Annotated[str, choice(TARGETS, "Target to rewrite for (ort-trt is not run by any ONNX Runtime yet).")]
OrtProvider = Annotated[str, choice(PROVIDERS, "ONNX Runtime execution provider for --onnx.")]
EngineDtype = Annotated[str | None, choice(
    STORAGE_TYPES, "Engines without a manifest: the dtype of the ONNX they were built from (picks the pass bar) "
                   "[what their I/O tensors tell].", aliases=DTYPE_ALIASES)]


def _range(text: str, low: int) -> DimRange:
    """``MIN:OPT:MAX`` (or ``N`` for ``N:N:N``) with ``low <= MIN <= OPT <= MAX <= MAX_DIM``; ValueError naming
    what is wrong."""
    try:
        values = [int(p) for p in text.split(":")]
    except ValueError:
        values = []
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise ValueError(f"{text!r}: expected MIN:OPT:MAX with whole numbers, e.g. {max(low, 1)}:8:64")
    lo, opt, hi = values
    if not low <= lo <= opt <= hi:
        raise ValueError(f"{text!r}: need {low} <= MIN <= OPT <= MAX")
    if hi > MAX_DIM:
        raise ValueError(f"{text!r}: MAX is over {MAX_DIM}; ask for a range a device can hold")
    return DimRange(lo, opt, hi)


def _usage(parse):
    """``parse`` with its ValueError turned into a usage error (exit 2) naming the option."""

    def parser(text):
        if not isinstance(text, str):
            return text
        try:
            return parse(text)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

    return parser


def range_option(help: str, low: int = 1):
    """A ``MIN:OPT:MAX`` option parsed into a DimRange (``low``: the smallest MIN, 0 for a past length)."""
    return typer.Option(parser=_usage(lambda text: _range(text, low)), metavar="MIN:OPT:MAX", help=help)


def parse_range(text: str | None, option: str, low: int = 1) -> DimRange | None:
    """``MIN:OPT:MAX`` given to ``--OPTION`` (for commands that parse it themselves; ``low``: the smallest MIN);
    None stays None."""
    if text is None:
        return None
    try:
        return _range(text, low)
    except ValueError as exc:
        raise AttnresError(f"--{option} {exc}") from None


@dataclass(frozen=True)
class TolOverride:
    dtype: str
    tolerance: Tolerance


def _tolerance(text: str) -> TolOverride:
    parts = text.split(":")
    try:
        name, rel, cos = canonical_dtype(parts[0]), float(parts[1]), float(parts[2])
    except (IndexError, ValueError):
        raise ValueError(f"{text!r}: expected DTYPE:rel_l2:cosine, e.g. float16:5e-3:0.9999") from None
    if len(parts) != 3 or name not in STORAGE_TYPES:
        raise ValueError(f"{text!r}: DTYPE must be one of {', '.join(STORAGE_TYPES)}")
    if not (math.isfinite(rel) and rel >= 0 and 0 <= cos <= 1):
        raise ValueError(f"{text!r}: need a finite rel_l2 >= 0 and 0 <= cosine <= 1")
    return TolOverride(name, Tolerance(rel, cos))


Tol = Annotated[list[TolOverride] | None, typer.Option(
    parser=_usage(_tolerance), metavar="DTYPE:REL_L2:COSINE",
    help="Override the pass bar of a dtype: relative L2 at most REL_L2, cosine at least COSINE (repeatable).")]


def parse_tolerances(values: Sequence[TolOverride] | None) -> dict[str, Tolerance]:
    """``--tol`` values (parsed by the option) -> the override per dtype."""
    return {v.dtype: v.tolerance for v in values or []}


class ShapeValue(tuple):
    """A ``--shapes`` value: (B, T), or (B, T, P) for a with-past graph."""


def _shape(text: str, parts: tuple[int, ...]) -> ShapeValue:
    spelled = " or ".join(",".join("BTP"[:n]) for n in parts)
    try:
        values = tuple(int(p) for p in text.split(","))
    except ValueError:
        values = ()
    if len(values) not in parts:
        raise ValueError(f"{text!r}: expected {spelled} with whole numbers, e.g. 2,64")
    if not all(1 <= v <= MAX_DIM for v in values[:2]) or not all(0 <= v <= MAX_DIM for v in values[2:]):
        raise ValueError(f"{text!r}: B and T must be between 1 and {MAX_DIM} (P between 0 and {MAX_DIM})")
    return ShapeValue(values)


CheckShapes = Annotated[list[ShapeValue] | None, typer.Option(
    "--shapes", parser=_usage(lambda text: _shape(text, (2, 3))), metavar="B,T[,P]",
    help="Shape to run (repeatable): batch, tokens, and for with-past graphs the past length [two from the "
         "exported ranges].")]
Shapes = Annotated[list[str] | None, typer.Option(help="B,T shape to run (repeatable) [from the artifact].")]


def parse_shapes(texts: list[str] | None) -> list[tuple[int, int]]:
    """``--shapes B,T`` values -> (B, T) pairs (for commands that parse them themselves)."""
    shapes = []
    for text in texts or []:
        try:
            shapes.append(tuple(_shape(text, (2,))))
        except ValueError as exc:
            raise AttnresError(f"--shapes {exc}") from None
    return shapes


@dataclass(frozen=True)
class ExampleShapeValue:
    name: str
    dims: list[int]
    dtype: str | None
    """None when not given: the exporter picks it from the name (exporter/foreign.py: example_input_dtype)."""


def _example_shape(text: str) -> ExampleShapeValue:
    parts = text.split(":")
    dtype = canonical_dtype(parts[2]) if len(parts) == 3 else None
    try:
        dims = [int(d) for d in parts[1].split(",")]
    except (IndexError, ValueError):
        dims = []
    if len(parts) not in (2, 3) or not parts[0] or not dims or min(dims) < 1 or dtype not in (*INPUT_DTYPES, None):
        raise ValueError(f"{text!r}: expected NAME:d0,d1,...[:DTYPE] with DTYPE one of {', '.join(INPUT_DTYPES)} "
                         "[int64 for names like input_ids, position_ids, attention_mask; else float32], e.g. "
                         "input_ids:2,16:int64")
    return ExampleShapeValue(parts[0], dims, dtype)


ExampleShape = Annotated[list[ExampleShapeValue] | None, typer.Option(
    "--example-shape", parser=_usage(_example_shape), metavar="NAME:D0,D1,...[:DTYPE]",
    help="Foreign models: an input's shape, and its dtype [int64 for index-like names such as input_ids, else "
         "float32] (repeatable).")]


def parse_example_shapes(values: Sequence[ExampleShapeValue] | None) -> dict[str, tuple[list[int], str | None]]:
    """``--example-shape`` values (parsed by the option) -> NAME -> (dims, dtype or None)."""
    return {v.name: (v.dims, v.dtype) for v in values or []}


Seed = Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Seed of the random inputs.")]
Plugin = Annotated[Path | None, typer.Option(help="Plugin library [from the engine manifest, else the latest build].")]
ReportPath = Annotated[Path | None, typer.Option("--report", help="Write the report as JSON here.")]
AllowEngineHostCode = Annotated[bool, typer.Option(
    help="Allow engine host code (engines built with --embed-plugin): runs code serialized inside the engine; "
         "only for engines you built or trust.")]
Strict = Annotated[bool, typer.Option(
    "--strict", help="Foreign models: fail (write nothing) when a depth aggregation is left unfused.")]
Vocab = Annotated[int | None, typer.Option(
    min=1, help="Foreign models: integer inputs are drawn from [0, VOCAB) [the size of the table they index, else 2].")]


def require_files(paths: Iterable[tuple[str, Path | None]]) -> None:
    """Inputs (option name, path) that do not exist are refused in one line before anything heavy is imported."""
    for option, path in paths:
        if path is not None and not path.exists():
            raise AttnresError(f"{option} {path}: no such file or folder")


def file_size(files: list[Path]) -> str:
    """Total size of ``files`` for messages."""
    return human_bytes(sum(f.stat().st_size for f in files))


def human_bytes(total: int) -> str:
    return f"{total / 1e6:.1f} MB" if total >= 1e5 else f"{total / 1e3:.1f} kB"
