"""The ranges every config number is checked against (docs/security.md#refused-before-anything-is-allocated).

A number in a model config either sizes something (layers, widths, heads, experts, positions: lists are made and
tensors shaped from it) or enters arithmetic (a norm's epsilon, a rotary base, a scaling factor). Each family reads
every such number through one table of ``Range``s keyed by its config keys, so that 10**9 layers, a negative rotary
base, a scaling factor that overflows float32 or a string is refused in one line naming the key and the range
before a list, a tensor or a formula is made of it. The bounds sit far above every published model (the largest:
126 layers, hidden size 16384, 384 experts, 2^20 positions) and low enough that no tensor size computed from
them overflows int64, so what is out of range is junk, not a model.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from attnres_export.errors import CheckpointError

MAX_LAYERS = 1 << 20
MAX_POSITIONS = 1 << 20
"""Longest sequence (``max_seq_len``, ``max_position_embeddings``): AttnResLM and RealFormer hold a table of this
many rows."""
MAX_WIDTH = 1 << 20
MAX_HEADS = 1 << 16
MAX_HEAD_DIM = 1 << 16
MAX_EXPERTS = 1 << 16
MAX_VOCAB = (1 << 31) - 1
"""Token ids are gathered as int32 by TensorRT."""
MAX_CONV = 1 << 8
FLOAT32_MAX = 3.4028234663852886e38
MAX_MULTIPLIER = 1e3
"""Factors that multiply activations or logits (routed scaling, yarn's attention factor and mscales): published
values are 0.7 to 2.8."""
MAX_CONFIG_DEPTH = 32
"""Nesting of a config's objects and lists; published configs nest 4 deep (K3: text_config, linear_attn_config,
a list)."""

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 2, 6, 4, 40, 40


def shown(value: Any) -> str:
    """``repr(value)``, cut short: a refusal stays one short line whatever the config holds."""
    return _SHOWN.repr(value)


def few(names: Iterable[Any]) -> str:
    """The first three of ``names`` and how many more: a refusal listing unknown keys stays one short line."""
    names = [shown(name) if not isinstance(name, str) else name[:60] for name in names]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _spelled(bound: float) -> str:
    """``1048576``, ``0.5``, ``3.4028234663852886e+38``: a bound as exactly as it is checked."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e16 else repr(float(bound))


def is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Range:
    """The accepted values of one config number: whole numbers ``low..high``, or finite numbers between ``low`` and
    ``high`` (``open_low``/``open_high``: the bound itself excluded)."""

    low: float
    high: float
    whole: bool = True
    open_low: bool = False
    open_high: bool = False

    def holds(self, value: Any) -> bool:
        if self.whole:
            return is_whole(value) and self.low <= value <= self.high
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        try:
            number = float(value)
        except OverflowError:  # an int beyond float's range
            return False
        return (math.isfinite(number) and (self.low < number if self.open_low else self.low <= number)
                and (number < self.high if self.open_high else number <= self.high))

    def describe(self) -> str:
        """``a whole number >= 1 and <= 1048576``, ``a finite number > 0 and <= 1000``."""
        low, high = _spelled(self.low), _spelled(self.high)
        if self.whole:
            return f"a whole number >= {low} and <= {high}"
        return f"a finite number {'>' if self.open_low else '>='} {low} and {'<' if self.open_high else '<='} {high}"

    def expected(self, value: Any) -> str | None:
        """``expected <description>, got <value>`` when ``value`` is out of range, else None."""
        return None if self.holds(value) else f"expected {self.describe()}, got {shown(value)}"


LAYERS = Range(1, MAX_LAYERS)
LAYER_COUNT = Range(0, MAX_LAYERS)
"""A count or index of layers that may be 0 (``first_k_dense_replace``, multi-token-prediction layers)."""
POSITIONS = Range(1, MAX_POSITIONS)
WIDTH = Range(1, MAX_WIDTH)
HEADS = Range(1, MAX_HEADS)
HEAD_DIM = Range(1, MAX_HEAD_DIM)
VOCAB = Range(1, MAX_VOCAB)
EXPERTS = Range(1, MAX_EXPERTS)
EXPERT_COUNT = Range(0, MAX_EXPERTS)
EPS = Range(0, 1, whole=False)
"""A norm's epsilon: 1e-5 to 1e-12 in practice; above 1 it swamps the mean square it guards."""
MULTIPLIER = Range(0, MAX_MULTIPLIER, whole=False, open_low=True)


def check_depth(value: Any, where: str) -> None:
    """Refuse a config nested deeper than ``MAX_CONFIG_DEPTH``, walked without recursion: comparing, copying or
    printing a deeper one would exhaust Python's stack."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise CheckpointError(f"{where}: nested more than {MAX_CONFIG_DEPTH} levels deep; not a model config")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else ()
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))


def layer_index(name: Any, prefix: str) -> int | None:
    """``i`` of a name ``prefix{i}.*`` (a state_dict key, a safetensors tensor name), else None (also for digits
    ``int`` cannot read: non-ASCII ones, or more than any index needs)."""
    if not isinstance(name, str) or not name.startswith(prefix):
        return None
    index = name[len(prefix):].split(".", 1)[0]
    return int(index) if index.isascii() and index.isdigit() and len(index) <= 18 else None


def layer_indices(names: Iterable[Any], prefix: str) -> set[int]:
    """The layer indices the names ``prefix{i}.*`` hold."""
    return {index for index in (layer_index(name, prefix) for name in names) if index is not None}


def layer_count_refusal(declared: int, held: set[int], where: str, key: str | None = None,
                        past: str | None = None) -> CheckpointError:
    """The one line refusing a config whose layer count is not the weights' (``key``: the config's spelling when it
    is not ``n_layers``; ``past``: a tensor of a layer past the last, when the caller names one)."""
    beyond = sorted(i for i in held if i >= declared)
    named = f" ({past} is past the last)" if past else f" (layer {beyond[0]} is past the last)" if beyond else ""
    spelled = f"{key}: " if key else ""
    return CheckpointError(f"{where}: {spelled}config says n_layers={declared} but the weights hold {len(held)} "
                           f"layers{named}; fix the config or the weights")
