"""The plain-values ``config`` of a checkpoint, validated with clear errors: the one config idiom of every family.

A family config, and each sub-config nested in it, is a frozen dataclass deriving ``Config``: its fields are the
settings (a nested sub-config is a field whose type is another ``Config``), ``problems()`` says what is wrong with
them (``RANGES`` and the family's own checks; raised on construction), ``to_dict()`` gives plain values (nested
dicts, lists) and ``from_dict()`` reads them back, refusing unknown, missing or mistyped keys in one line. A flat
family derives ``FamilyConfig`` (``arch``, ``vocab_size``, ``max_seq_len`` as fields); each family defines its own
fields next to its model, nanoGPT-style, and its ``describe()``.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

from attnres_export.errors import CheckpointError
from attnres_export.models.limits import POSITIONS, VOCAB, Range, few, is_whole, shown


@dataclass(frozen=True)
class Config:
    """Base of every config and sub-config. Subclasses add fields, ``RANGES`` and ``problems``."""

    KIND: ClassVar[str] = "model"
    """What the config is of, in its refusal (``invalid <KIND> config: ...``)."""
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    """Keys a stored config may leave out (they take the field's default)."""
    DEFAULTED_OPTIONAL: ClassVar[bool] = False
    """True: every key whose field has a default may be left out (``OPTIONAL`` lists them all)."""
    LEGACY: ClassVar[dict[str, Any]] = {}
    """Keys older checkpoints wrote for every family: accepted only with this value, then dropped."""
    RANGES: ClassVar[dict[str, Range]] = {}
    """Every number of the config and its accepted values (``models/limits.py``): the one place they are checked;
    None is "not set"."""

    def __post_init__(self) -> None:
        problems = list(self.problems())
        if problems:
            raise CheckpointError(f"invalid {self.KIND} config: {'; '.join(problems)}")

    def problems(self) -> Iterator[str]:
        """The numbers out of their ``RANGES``; a family adds the checks that relate its fields."""
        for name, accepted in self.RANGES.items():
            value = getattr(self, name)
            if value is not None and not accepted.holds(value):
                yield f"{name} must be {accepted.describe()}, got {name}={shown(value)}"

    def to_dict(self) -> dict[str, Any]:
        """Plain values: nested configs as dicts, tuples as lists; ``from_dict`` reads them back."""
        return {item.name: _plain(getattr(self, item.name)) for item in fields(self)}

    @classmethod
    def from_dict(cls, raw: Any, what: str = "checkpoint config") -> Config:
        """Build from a checkpoint's ``config`` (or a nested part of it, ``what``); unknown, missing or mistyped keys
        are refused."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{what} must be a dict of plain values, got {type(raw).__name__}")
        known = {f.name: f for f in fields(cls)}
        raw = dict(raw)
        for key, value in cls.LEGACY.items():
            if key in raw and key not in known:
                if raw[key] != value:
                    raise CheckpointError(f"{what} key {key!r} = {shown(raw[key])} does not apply to "
                                          f"{shown(raw.get('arch'))} models (only {value!r})")
                del raw[key]
        unknown = sorted(set(raw) - set(known), key=str)
        if unknown:
            raise CheckpointError(f"{what} has unknown keys: {few(unknown)}")
        optional = cls.OPTIONAL | ({name for name, f in known.items()
                                    if f.default is not MISSING or f.default_factory is not MISSING}
                                   if cls.DEFAULTED_OPTIONAL else set())
        missing = sorted(set(known) - set(raw) - optional)
        if missing:
            raise CheckpointError(f"{what} is missing keys: {', '.join(missing)}")
        hints = typing.get_type_hints(cls)
        return cls(**{name: _coerce(f"{what} key {name!r}", value, hints[name]) for name, value in raw.items()})


@dataclass(frozen=True)
class FamilyConfig(Config):
    """Base of a flat family config: ``arch``, ``vocab_size`` and ``max_seq_len`` are what code outside the family
    reads; the rest is the family's own."""

    arch: str
    vocab_size: int
    max_seq_len: int

    RANGES: ClassVar[dict[str, Range]] = {"vocab_size": VOCAB, "max_seq_len": POSITIONS}


def _plain(value: Any) -> Any:
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _coerce(where: str, value: Any, annotation: Any) -> Any:
    """``value`` as the field's type: a nested config from its dict, a tuple from a list, a number checked."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    if options:
        if value is None and type(None) in options:
            return None
        annotation = next(option for option in options if option is not type(None))
    if isinstance(annotation, type) and issubclass(annotation, Config):
        return annotation.from_dict(value, where)
    if typing.get_origin(annotation) is tuple:
        if not isinstance(value, list):
            raise CheckpointError(f"{where} must be a list, got {type(value).__name__} {shown(value)}")
        return tuple(_coerce(where, item, typing.get_args(annotation)[0]) for item in value)
    if typing.get_origin(annotation) is dict:
        if not isinstance(value, dict):
            raise CheckpointError(f"{where} must be a dict, got {type(value).__name__}")
        return dict(value)
    expected = annotation
    if expected is float and is_whole(value):
        if abs(value) > sys.float_info.max:
            raise CheckpointError(f"{where} = {shown(value)} is beyond a float's range")
        return float(value)
    if expected is int and isinstance(value, bool):
        raise CheckpointError(f"{where} must be int, got bool")
    if not isinstance(value, expected):
        raise CheckpointError(f"{where} must be {expected.__name__}, got {type(value).__name__} {shown(value)}")
    return value

