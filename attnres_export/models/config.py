"""Model configuration: the plain-values ``config`` of a checkpoint, validated with clear errors."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from attnres_export.errors import CheckpointError

ARCHS = ("attnres-lm", "realformer")
RESIDUALS = ("attnres", "standard")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a reference model (docs/models.md)."""

    arch: str = "attnres-lm"
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    residual: str = "attnres"
    block_size: int = 0
    eps: float = 1e-6
    max_seq_len: int = 512
    running_mean: bool = False

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise CheckpointError(f"invalid model config: {'; '.join(problems)}")

    def _problems(self):
        if self.arch not in ARCHS:
            yield f"arch must be one of {', '.join(ARCHS)}, got {self.arch!r}"
        if self.residual not in RESIDUALS:
            yield f"residual must be one of {', '.join(RESIDUALS)}, got {self.residual!r}"
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) < 1:
                yield f"{name} must be >= 1, got {getattr(self, name)}"
        if self.block_size < 0:
            yield f"block_size must be >= 0 (0 = Full AttnRes), got {self.block_size}"
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            yield f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}"
        elif self.arch == "attnres-lm" and self.n_heads >= 1 and (self.d_model // self.n_heads) % 2:
            yield f"head size {self.d_model // self.n_heads} must be even for rotary embeddings"
        if not (math.isfinite(self.eps) and self.eps >= 0):
            yield f"eps must be a finite number >= 0, got {self.eps}"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> ModelConfig:
        """Build from a checkpoint's ``config``; unknown, missing or mistyped keys are refused."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"checkpoint 'config' must be a dict of plain values, got {type(raw).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise CheckpointError(f"checkpoint config has unknown keys: {', '.join(map(str, unknown))}")
        optional = {"running_mean"}
        missing = sorted(set(known) - set(raw) - optional)
        if missing:
            raise CheckpointError(f"checkpoint config is missing keys: {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            values[name] = _coerce(name, value, known[name].type)
        return cls(**values)


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    expected = {"int": int, "float": float, "str": str, "bool": bool}[str(annotation)]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, bool):
        raise CheckpointError(f"checkpoint config key {name!r} must be int, got bool")
    if not isinstance(value, expected):
        raise CheckpointError(
            f"checkpoint config key {name!r} must be {expected.__name__}, got {type(value).__name__} {value!r}"
        )
    return value
