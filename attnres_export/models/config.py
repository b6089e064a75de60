"""The plain-values ``config`` of a checkpoint, validated with clear errors: the machinery every family's config
dataclass shares (each family defines its own fields next to its model, nanoGPT-style)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from attnres_export.errors import CheckpointError
from attnres_export.models.limits import POSITIONS, VOCAB, Range, few, is_whole, shown


@dataclass(frozen=True)
class FamilyConfig:
    """Base of every family config: ``arch``, ``vocab_size`` and ``max_seq_len`` are what code outside the family
    reads; the rest is the family's own. Subclasses add fields and ``problems``."""

    arch: str
    vocab_size: int
    max_seq_len: int

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    """Keys a stored config may leave out (they take the field's default)."""
    LEGACY: ClassVar[dict[str, Any]] = {}
    """Keys older checkpoints wrote for every family: accepted only with this value, then dropped."""
    RANGES: ClassVar[dict[str, Range]] = {"vocab_size": VOCAB, "max_seq_len": POSITIONS}
    """Every number of the config and its accepted values (``models/limits.py``): the one place they are checked."""

    def __post_init__(self) -> None:
        problems = list(self.problems())
        if problems:
            raise CheckpointError(f"invalid model config: {'; '.join(problems)}")

    def problems(self) -> Iterator[str]:
        """The numbers out of their ``RANGES``; a family adds the checks that relate its fields."""
        for name, accepted in self.RANGES.items():
            value = getattr(self, name)
            if not accepted.holds(value):
                yield f"{name} must be {accepted.describe()}, got {name}={shown(value)}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> FamilyConfig:
        """Build from a checkpoint's ``config``; unknown, missing or mistyped keys are refused."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"checkpoint 'config' must be a dict of plain values, got {type(raw).__name__}")
        known = {f.name: f for f in fields(cls)}
        raw = dict(raw)
        for key, value in cls.LEGACY.items():
            if key in raw and key not in known:
                if raw[key] != value:
                    raise CheckpointError(f"checkpoint config key {key!r} = {shown(raw[key])} does not apply to "
                                          f"{shown(raw.get('arch'))} models (only {value!r})")
                del raw[key]
        unknown = sorted(set(raw) - set(known), key=str)
        if unknown:
            raise CheckpointError(f"checkpoint config has unknown keys: {few(unknown)}")
        missing = sorted(set(known) - set(raw) - cls.OPTIONAL)
        if missing:
            raise CheckpointError(f"checkpoint config is missing keys: {', '.join(missing)}")
        return cls(**{name: _coerce(name, value, known[name].type) for name, value in raw.items()})


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    expected = {"int": int, "float": float, "str": str, "bool": bool}[str(annotation)]
    if expected is float and is_whole(value):
        if abs(value) > sys.float_info.max:
            raise CheckpointError(f"checkpoint config key {name!r} = {shown(value)} is beyond a float's range")
        return float(value)
    if expected is int and isinstance(value, bool):
        raise CheckpointError(f"checkpoint config key {name!r} must be int, got bool")
    if not isinstance(value, expected):
        raise CheckpointError(
            f"checkpoint config key {name!r} must be {expected.__name__}, got {type(value).__name__} {shown(value)}"
        )
    return value
