"""ONNX Runtime's int8 activations of ``MatMulNBits`` (``accuracy_level`` 4), computed by the PyTorch reference
(docs/quantization.md#int8-activations).

With ``accuracy_level`` 4, ONNX Runtime's CPU ``MatMulNBits`` quantizes its input (the activations) to int8 at run
time, per block of ``block_size`` input columns (the weight's block): ``scale = max|a| / 127`` and ``q =
round_half_even(a * (127 / max|a|))`` in float32, then multiplies the integer blocks and rescales. The weights'
blocks are what the graph holds, so the reference computes the same product when each such ``Linear``'s input is
replaced by ``q * scale`` first. Measured against ONNX Runtime 1.32's kernel on one ``MatMulNBits`` node (4 and 8
bits, blocks 16-128, odd widths): relative L2 1.2e-7 to 3.4e-7 from this emulation, 4e-3 to 6e-3 from the
float32-activation product (``tests/parity/test_int8_activations.py``).

Rounding is discontinuous, so a whole model is compared with its roundings forced (``forced_roundings``): a value
that float32 arithmetic in another order moves across a half step rounds the other way, and the rounding-aware
comparison (parity/rounding.py) reruns the reference with the artifact's own int8 values wherever the two differ
at such a tie."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from attnres_export.errors import ParityError

INT8_MAX = 127


@dataclass
class Roundings:
    """The int8 values one forward pass takes from an artifact (``forced``: its ``MatMulNBits`` inputs by weight
    name) where the reference's own value lies within ``tie_steps`` of the half step, and what it counted."""

    forced: Mapping[str, np.ndarray]
    tie_steps: float
    values: int = 0
    adopted: int = 0
    """Values the artifact rounds to the other neighbour of a tie: taken from the artifact."""
    disagreements: int = 0
    """Values that differ without a tie: left as the reference rounds them (a wrong activation still fails)."""
    seen: set[str] = field(default_factory=set)


_ROUNDINGS: ContextVar[Roundings | None] = ContextVar("int8_roundings", default=None)


@contextmanager
def forced_roundings(forced: Mapping[str, np.ndarray], tie_steps: float) -> Iterator[Roundings]:
    """Inside, each quantizing ``Linear`` whose weight name is in ``forced`` takes the artifact's rounding at ties
    (``Roundings``)."""
    roundings = Roundings(forced, tie_steps)
    token = _ROUNDINGS.set(roundings)
    try:
        yield roundings
    finally:
        _ROUNDINGS.reset(token)


def int8_blocks(x: torch.Tensor, block: int, artifact: np.ndarray | None = None,
                roundings: Roundings | None = None) -> torch.Tensor:
    """``x`` with each block of ``block`` values along its last axis replaced by its int8 quantization times its
    scale, as ``MatMulNBits`` quantizes its activations (a last, partial block is quantized by itself). With the
    ``artifact``'s own input of that ``MatMulNBits`` (float32, ``x``'s shape), its int8 value is taken wherever it
    is the other neighbour of a tie (``roundings`` counts)."""
    columns = x.shape[-1]
    blocks = _blocked(x, block)
    scale, inverse = _scales(blocks)
    exact = blocks * inverse.to(x.dtype)
    values = torch.round(exact).clamp(-INT8_MAX, INT8_MAX)
    if artifact is not None and roundings is not None:
        values = _with_ties_taken(values, exact, _blocked(torch.from_numpy(artifact).reshape(x.shape), block),
                                  roundings)
    return (values * scale.to(x.dtype)).flatten(-2)[..., :columns]


def _blocked(x: torch.Tensor, block: int) -> torch.Tensor:
    return nn.functional.pad(x, (0, -x.shape[-1] % block)).unflatten(-1, (-1, block))


def _scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each block's scale ``max|a| / 127`` and the factor the kernel multiplies by, ``127 / max|a|`` (0 for a block
    of zeros), both float32: ties round as ONNX Runtime rounds them only with this factor, not ``1 / scale``
    (measured: 82,080 of 640,000 values constructed at ties differ with ``1 / scale``, none with this)."""
    amax = blocks.abs().amax(-1, keepdim=True).to(torch.float32)
    steps = torch.full_like(amax, INT8_MAX)  # ``127 / tensor`` is 127 times the reciprocal in torch: rounded twice
    return amax / steps, torch.where(amax > 0, steps / amax, torch.zeros_like(amax))


def _with_ties_taken(values: torch.Tensor, exact: torch.Tensor, artifact: torch.Tensor,
                     roundings: Roundings) -> torch.Tensor:
    """``values`` with the artifact's int8 value (computed in float32, as the kernel does) where it differs by one
    step and the reference's unrounded value is within ``roundings.tie_steps`` of the half step between them."""
    theirs = torch.round(artifact * _scales(artifact)[1]).clamp(-INT8_MAX, INT8_MAX).to(values.dtype)
    differ = theirs != values
    tie = ((exact - exact.floor() - 0.5).abs() <= roundings.tie_steps) & ((theirs - values).abs() == 1)
    roundings.values += values.numel()
    roundings.adopted += int((differ & tie).sum())
    roundings.disagreements += int((differ & ~tie).sum())
    return torch.where(differ & tie, theirs, values)


def with_int8_activations(model: nn.Module, blocks: Mapping[str, Mapping]) -> nn.Module:
    """``model`` (changed in place) with the input of the ``Linear`` owning each weight of ``blocks`` (state_dict
    name -> its ``block`` size) quantized by ``int8_blocks`` before it multiplies."""
    for name, written in blocks.items():
        owner = name.removesuffix(".weight")
        module = model.get_submodule(owner) if owner != name else None
        if not isinstance(module, nn.Linear):
            raise ParityError(f"{name}: written as MatMulNBits with int8 activations, but it is not a Linear's weight "
                              "in the reference model, which cannot quantize its input the same way (please report "
                              "this)")
        module.register_forward_pre_hook(_quantizing_hook(name, int(written["block"])))
    return model


def _quantizing_hook(name: str, block: int) -> Callable:
    def hook(_module: nn.Module, args: tuple) -> tuple:
        roundings = _ROUNDINGS.get()
        artifact = None
        if roundings is not None and name in roundings.forced:
            if name in roundings.seen:
                raise ParityError(f"{name}: its Linear ran twice in one forward pass, but the artifact's input of its "
                                  "MatMulNBits is one tensor (please report this)")
            roundings.seen.add(name)
            artifact = roundings.forced[name]
        return (int8_blocks(args[0], block, artifact, roundings), *args[1:])

    return hook


def reference_with(model: Callable[[], nn.Module], blocks: Mapping[str, Mapping] | None) -> Callable[[], nn.Module]:
    """The reference-model provider for a graph whose ``blocks`` weights (None or empty: none) run with int8
    activations."""
    if not blocks:
        return model
    return lambda: with_int8_activations(model(), blocks)
