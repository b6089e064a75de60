"""ONNX Runtime's int8 activations of ``MatMulNBits`` (``accuracy_level`` 4), computed by the PyTorch reference
(docs/quantization.md#int8-activations).

With ``accuracy_level`` 4, ONNX Runtime's CPU ``MatMulNBits`` quantizes its input (the activations) to int8 at run
time, per block of ``block_size`` input columns (the weight's block): ``scale = max|a| / 127`` in float32,
``q = round(a / scale)``, then multiplies the integer blocks and rescales. The weights' blocks are what the graph
holds, so the reference computes the same product when each such ``Linear``'s input is replaced by ``q * scale``
first. Measured against ONNX Runtime 1.32's kernel on one ``MatMulNBits`` node (4 and 8 bits, blocks 16-128, odd
widths): relative L2 1.2e-7 to 3.4e-7 from this emulation, 4e-3 to 6e-3 from the float32-activation product
(``tests/parity/test_int8_activations.py``). So an export written with int8 activations is judged at the float32
bars against the model it computes, as every other export is."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from attnres_export.errors import ParityError

INT8_MAX = 127


def int8_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` with each block of ``block`` values along its last axis replaced by its int8 quantization times its
    scale, as ``MatMulNBits`` quantizes its activations (a last, partial block is quantized by itself)."""
    columns = x.shape[-1]
    blocks = nn.functional.pad(x, (0, -columns % block)).unflatten(-1, (-1, block))
    scale = blocks.abs().amax(-1, keepdim=True).to(torch.float32) / INT8_MAX
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    values = torch.round(blocks * inverse.to(x.dtype)).clamp(-INT8_MAX, INT8_MAX)
    return (values * scale.to(x.dtype)).flatten(-2)[..., :columns]


def with_int8_activations(model: nn.Module, blocks: Mapping[str, int]) -> nn.Module:
    """``model`` (changed in place) with the input of the ``Linear`` owning each weight of ``blocks`` (state_dict
    name -> block size) quantized by ``int8_blocks`` before it multiplies."""
    for name, block in blocks.items():
        owner = name.removesuffix(".weight")
        module = model.get_submodule(owner) if owner != name else None
        if not isinstance(module, nn.Linear):
            raise ParityError(f"{name}: written as MatMulNBits with int8 activations, but it is not a Linear's weight "
                              "in the reference model, which cannot quantize its input the same way (please report "
                              "this)")
        module.register_forward_pre_hook(_quantizing_hook(int(block)))
    return model


def _quantizing_hook(block: int) -> Callable:
    def hook(_module: nn.Module, args: tuple) -> tuple:
        return (int8_blocks(args[0], block), *args[1:])

    return hook


def reference_with(model: Callable[[], nn.Module], blocks: Mapping[str, int] | None) -> Callable[[], nn.Module]:
    """The reference-model provider for a graph whose ``blocks`` weights (None or empty: none) run with int8
    activations."""
    if not blocks:
        return model
    return lambda: with_int8_activations(model(), blocks)
