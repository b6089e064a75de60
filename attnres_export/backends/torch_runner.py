"""A PyTorch module behind the runner interface: the float32 reference of every parity check."""

from __future__ import annotations

import copy

import torch
from torch import nn

from attnres_export.backends.base import Feeds, Runner
from attnres_export.dtypes import torch_dtype
from attnres_export.ops.precision import at_least_float32


class TorchRunner(Runner):
    """A PyTorch module in eager mode, on the CPU; ``dtype`` casts a copy (the float32 one is the reference, the
    float64 one measures the float32 one's own error)."""

    def __init__(self, model: nn.Module, output_names: list[str], dtype: str = "float32", artifact: str = "") -> None:
        self.backend = f"pytorch-{dtype}"
        self.artifact = artifact
        self.output_names = output_names
        self.model = model if dtype == "float32" else copy.deepcopy(model).to(torch_dtype(dtype))

    def infer(self, feeds: Feeds) -> Feeds:
        with torch.inference_mode():
            outputs = self.model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: at_least_float32(t).numpy() for name, t in zip(self.output_names, outputs, strict=True)}
