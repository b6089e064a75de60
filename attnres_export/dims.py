"""``MIN:OPT:MAX`` ranges of the dynamic dims (batch, sequence), as TensorRT optimization profiles want them."""

from __future__ import annotations

from dataclasses import dataclass

from attnres_export.errors import ExportError


@dataclass(frozen=True)
class DimRange:
    """A dynamic dim's allowed range and the size to optimise (and trace) for."""

    min: int
    opt: int
    max: int

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"

    def as_list(self) -> list[int]:
        return [self.min, self.opt, self.max]

    @classmethod
    def parse(cls, text: str, what: str) -> DimRange:
        """Parse ``MIN:OPT:MAX`` (or a single ``N`` meaning ``N:N:N``)."""
        parts = text.split(":")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) == 1:
            values = values * 3
        if len(values) != 3:
            raise ExportError(f"--{what} {text!r}: expected MIN:OPT:MAX with whole numbers, e.g. 1:8:64")
        lo, opt, hi = values
        if not 1 <= lo <= opt <= hi:
            raise ExportError(f"--{what} {text!r}: need 1 <= MIN <= OPT <= MAX")
        return cls(lo, opt, hi)
