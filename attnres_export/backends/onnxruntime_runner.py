"""Backends behind one interface (Polygraphy's idea): ``activate``, ``infer``, ``deactivate``.

Adding a backend is one class. Every runner takes and returns NumPy arrays keyed by tensor name.
"""

from __future__ import annotations

import abc
import copy
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from attnres_export.errors import ParityError
from attnres_export.exporter.save import needs_external_data
from attnres_export.graphs.emulation import emulate_bfloat16, has_bfloat16
from attnres_export.graphs.onnx_utils import attnres_nodes
from attnres_export.ops.identity import ORT_TRT_DOMAIN

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Runner(abc.ABC):
    """One backend running one artifact."""

    backend: str
    artifact: str

    def activate(self) -> None:  # noqa: B027 - optional hook, most runners need no setup
        """Acquire what inference needs (sessions, engines); called once before ``infer``."""

    @abc.abstractmethod
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one inference."""

    def deactivate(self) -> None:  # noqa: B027 - optional hook
        """Release what ``activate`` acquired."""

    def __enter__(self) -> Runner:
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()


class TorchRunner(Runner):
    """A PyTorch module in eager mode, on the CPU; ``dtype`` casts a copy (the float32 one is the reference)."""

    def __init__(self, model: nn.Module, output_names: list[str], dtype: str = "float32", artifact: str = "") -> None:
        self.backend = f"pytorch-{dtype}"
        self.artifact = artifact
        self.output_names = output_names
        self.model = model if dtype == "float32" else copy.deepcopy(model).to(TORCH_DTYPES[dtype])

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            outputs = self.model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        return {name: t.float().numpy() for name, t in zip(self.output_names, outputs, strict=True)}


class OnnxRuntimeRunner(Runner):
    """ONNX Runtime on the CPU (or another provider).

    A model with attnres nodes runs with their NumPy reference (onnxruntime-extensions); a bfloat16 model
    runs through the bfloat16 emulation (ONNX Runtime CPU has no bfloat16 arithmetic kernels).
    """

    name = "onnxruntime"

    def __init__(self, model: onnx.ModelProto | Path, providers: list[str] | None = None, artifact: str = "") -> None:
        self.source = model
        self.providers = providers or ["CPUExecutionProvider"]
        self.artifact = artifact or (str(model) if isinstance(model, Path) else "")
        self.session = None
        loaded = self._load()
        self.uses_reference_ops = bool(attnres_nodes(loaded.graph) or attnres_nodes(loaded.graph, ORT_TRT_DOMAIN))
        self.emulates_bfloat16 = has_bfloat16(loaded)
        kind = self.name + ("+ref-ops" if self.uses_reference_ops else "")
        self.backend = kind + ("+bf16-emulation" if self.emulates_bfloat16 else "")
        self._model = loaded

    def _load(self) -> onnx.ModelProto:
        if isinstance(self.source, onnx.ModelProto):
            return self.source
        return onnx.load(str(self.source))

    def activate(self) -> None:
        import onnxruntime as ort

        from attnres_export.parity import ort_reference

        model = self._model
        if self.emulates_bfloat16:
            model = emulate_bfloat16(model)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if self.uses_reference_ops:
            model = ort_reference.with_reference_ops(model)
            options.register_custom_ops_library(ort_reference.library_path())
        try:
            self.session = _session(model, options, self.providers)
        except Exception as exc:
            raise ParityError(f"ONNX Runtime could not load {self.artifact or 'the model'}: {exc}") from exc

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.session is None:
            raise ParityError("runner used before activate()")
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, feeds), strict=True))

    def deactivate(self) -> None:
        self.session = None


def _session(model: onnx.ModelProto, options, providers: list[str]):
    """An ONNX Runtime session; models over protobuf's 2 GB limit go through a temporary external-data file."""
    import onnxruntime as ort

    if not needs_external_data(model):
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    with tempfile.TemporaryDirectory(prefix="attnres-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(_copy(model), str(path), save_as_external_data=True, location="model.onnx.data")
        return ort.InferenceSession(str(path), options, providers=providers)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def cuda_provider_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


class OnnxRuntimeCudaRunner(OnnxRuntimeRunner):
    """ONNX Runtime's CUDA execution provider (onnxruntime-gpu); attnres reference ops still run on the CPU."""

    name = "onnxruntime-cuda"

    def __init__(self, model: onnx.ModelProto | Path, artifact: str = "") -> None:
        if not cuda_provider_available():
            raise ParityError("ONNX Runtime has no CUDAExecutionProvider here: install onnxruntime-gpu (in place of "
                              "onnxruntime) on a machine with an NVIDIA GPU, or use the CPU provider")
        super().__init__(model, ["CUDAExecutionProvider", "CPUExecutionProvider"], artifact)
