"""TensorRT optimization profiles from an ONNX's dynamic dims, its export metadata and the requested ranges.

The exporter traced the model for the ranges recorded in its metadata; a profile outside them would build an
engine for shapes the graph was never valid for, so such a range is refused here, before TensorRT runs.

A with-past export (docs/decode.md) has a fourth dim, ``total`` = ``past + seq`` (the attention mask's length):
it is never asked for, but derived from the past and seq ranges of the profile, so that narrowing ``--past`` or
``--seq`` narrows the mask too and the engine is tuned for shapes that can occur together.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from attnres_export.dims import DimRange
from attnres_export.errors import EngineError
from attnres_export.graphs.metadata import export_info, input_axes

Shape = tuple[int, ...]
TOTAL = "total"
"""The with-past dim ``past + seq`` (docs/decode.md)."""


@dataclass(frozen=True)
class InputProfile:
    """Min, opt and max shape of one network input."""

    name: str
    min: Shape
    opt: Shape
    max: Shape

    def to_dict(self) -> dict:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class Profile:
    """One optimization profile: a shape range per input, the named dim ranges, and each input's axes."""

    inputs: tuple[InputProfile, ...]
    dims: dict[str, DimRange]
    axes: dict[str, list[str | int]]

    def to_dict(self) -> dict:
        return {i.name: i.to_dict() for i in self.inputs}


def derive_profile(model: onnx.ModelProto, ranges: dict[str, DimRange | None] | None = None) -> Profile:
    """The profile for ``ranges`` (``None`` entries: the exported range) checked against the exported dims."""
    info = export_info(model)
    exported = {name: DimRange(*values) for name, values in info.get("dims", {}).items()}
    requested = {k: v for k, v in (ranges or {}).items() if v is not None}
    if TOTAL in requested:
        raise EngineError(f"--{TOTAL}: {TOTAL} is past + seq, derived from their ranges; pass --past or --seq instead")
    if {TOTAL, "past", "seq"} <= exported.keys():
        requested[TOTAL] = _total_range(exported, requested)
    used: dict[str, DimRange] = {}
    labelled: dict[str, list[str | int]] = {}
    profiles = []
    for name, dims in input_axes(model).items():
        recorded = info.get("inputs", {}).get(name, [])
        labels = [recorded[a] if a < len(recorded) else (d if isinstance(d, str) else None) for a, d in enumerate(dims)]
        shapes = [_axis_range(name, a, d, labels[a], exported, requested) for a, d in enumerate(dims)]
        used |= {labels[a]: shapes[a] for a, d in enumerate(dims) if isinstance(d, str) and labels[a]}
        labelled[name] = [labels[a] if isinstance(d, str) and labels[a] else d for a, d in enumerate(dims)]
        profiles.append(InputProfile(name, *(tuple(getattr(r, k) for r in shapes) for k in ("min", "opt", "max"))))
    known = set(used) | {label for recorded in info.get("inputs", {}).values() for label in recorded}
    unknown = sorted(set(requested) - known)
    if unknown:
        raise EngineError(f"--{unknown[0]}: the ONNX has no dynamic dim named {unknown[0]!r} "
                          f"(its dims: {', '.join(sorted(used)) or 'none'})")
    return Profile(tuple(profiles), used, labelled)


def _total_range(exported: dict[str, DimRange], requested: dict[str, DimRange]) -> DimRange:
    """``past + seq`` over the profile's past and seq ranges, its max clipped to the recorded total (the model's
    max_seq_len); refused when the opt pair, or the longest past with the fewest new tokens, cannot fit in it."""
    past, seq = (_inside(name, requested.get(name, exported[name]), exported[name]) for name in ("past", "seq"))
    limit = exported[TOTAL].max
    for what, size in (("OPT past + OPT seq", past.opt + seq.opt), ("MAX past + MIN seq", past.max + seq.min)):
        if size > limit:
            raise EngineError(f"--past {past} with --seq {seq}: {what} is {size}, over the exported {TOTAL} max "
                              f"{limit} (past + seq, the attention mask's length); lower --past or --seq")
    return DimRange(past.min + seq.min, past.opt + seq.opt, min(past.max + seq.max, limit))


def _axis_range(name: str, axis: int, dim: str | int, label: str | None, exported: dict[str, DimRange],
                requested: dict[str, DimRange]) -> DimRange:
    if isinstance(dim, int):
        if dim < 1:
            raise EngineError(f"input {name!r} axis {axis} has no size and no dim name; re-export the model")
        wanted = requested.get(label) if label else None
        if wanted is not None and (wanted.min, wanted.max) != (dim, dim):
            raise EngineError(f"--{label} {wanted}: input {name!r} has a static {label} of {dim} in this ONNX; "
                              f"re-export with --{label} MIN:OPT:MAX to build for a range")
        return DimRange(dim, dim, dim)
    key = label or dim
    bounds = exported.get(key)
    wanted = requested.get(key, bounds)
    if wanted is None:
        raise EngineError(f"input {name!r} axis {axis} is dynamic ({dim!r}) and the ONNX records no range for it; "
                          f"pass --{key} MIN:OPT:MAX")
    return wanted if bounds is None else _inside(key, wanted, bounds)


def _inside(key: str, wanted: DimRange, bounds: DimRange) -> DimRange:
    if not (bounds.min <= wanted.min and wanted.max <= bounds.max):
        raise EngineError(f"--{key} {wanted} is outside the exported {key} range {bounds}; "
                          f"re-export with --{key} covering it, or build within {bounds.min}..{bounds.max}")
    return wanted
