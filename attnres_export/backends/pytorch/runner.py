"""A PyTorch module behind the runner interface: the float32 reference of every parity check."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils import parametrize

from attnres_export.backends.base import Feeds, Runner
from attnres_export.dtypes import torch_dtype
from attnres_export.models.base import KeepFloat32
from attnres_export.ops.precision import at_least_float32


class TorchRunner(Runner):
    """A PyTorch module in eager mode, on the CPU, computing in ``dtype`` (float32: the reference; float64: what
    measures the float32 one's own error; float16/bfloat16: what measures a 16-bit artifact's, with the tensors a
    16-bit model keeps float32 left float32, as a 16-bit export keeps them). The module is not copied: a tensor
    stored in another type is cast each time it is read, so a float64 run of a multi-GB model holds one layer's
    weights in float64 at a time."""

    def __init__(self, model: nn.Module, output_names: list[str], dtype: str = "float32", artifact: str = "") -> None:
        self.backend = f"pytorch-{dtype}"
        self.artifact = artifact
        self.output_names = output_names
        self.model = model
        self.dtype = torch_dtype(dtype)

    def infer(self, feeds: Feeds) -> Feeds:
        with torch.inference_mode(), read_as(self.model, self.dtype):
            outputs = self.model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: at_least_float32(t).numpy() for name, t in zip(self.output_names, outputs, strict=True)}


RECENT_CASTS = 2
"""Casts kept for reuse: a module that reads its stacked expert weights once per expert (``StackedExperts``'s
``grouped`` form reads ``gate_up_proj`` and ``down_proj`` in turn) casts each once per call, not once per expert,
and at most this many cast tensors outlive their read."""


class _Cast(nn.Module):
    """Casts to ``dtype``, reusing the ``RECENT_CASTS`` latest casts of tensors unchanged since."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.recent: list[tuple[torch.Tensor, int, torch.Tensor]] = []

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        for source, version, cast in self.recent:
            if source is tensor and version == tensor._version:
                return cast
        cast = tensor.to(self.dtype)
        self.recent = [(tensor, tensor._version, cast), *self.recent[:RECENT_CASTS - 1]]
        return cast


@contextmanager
def read_as(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Inside, every floating-point parameter and buffer of ``model`` reads as ``dtype`` (a parametrization
    casts it at each access), except that a 16-bit ``dtype`` leaves ``KeepFloat32`` tensors as they are;
    afterwards the module is as it was, the same tensors in the same places."""
    cast = _Cast(dtype)
    kept = _kept_float32(model) if dtype in (torch.float16, torch.bfloat16) else set()
    registered: list[tuple[nn.Module, str, bool]] = []
    try:
        for module in list(model.modules()):
            owned = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            for name, tensor in owned:
                if tensor.is_floating_point() and tensor.dtype != dtype and id(tensor) not in kept:
                    transient = name in module._non_persistent_buffers_set
                    parametrize.register_parametrization(module, name, cast, unsafe=True)
                    registered.append((module, name, transient))
        yield
    finally:
        for module, name, transient in reversed(registered):
            parametrize.remove_parametrizations(module, name, leave_parametrized=False)
            if transient:  # removal registers a buffer back as persistent: it would join the state_dict
                module.register_buffer(name, getattr(module, name), persistent=False)


def _kept_float32(model: nn.Module) -> set[int]:
    """The ids of the tensors ``KeepFloat32`` modules of ``model`` keep float32 in a 16-bit model."""
    return {id(tensor) for module in model.modules() if isinstance(module, KeepFloat32)
            for tensor in module._float_tensors().values()}
