"""ONNX Runtime behind the runner interface, on the CPU or the CUDA execution provider.

A model with attnres nodes runs with their NumPy reference (onnxruntime-extensions); a bfloat16 model runs
through the bfloat16 emulation (ONNX Runtime CPU has no bfloat16 arithmetic kernels). Every model is validated
against the op-set contract first: a malformed attnres node would abort the process inside ONNX Runtime.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from attnres_export.atomic import scratch_file_beside
from attnres_export.backends.base import Feeds, Runner
from attnres_export.backends.onnxruntime import reference_ops
from attnres_export.backends.onnxruntime.bf16_emulation import (
    SESSION_DISABLED_OPTIMIZERS,
    emulate_bfloat16,
    has_bfloat16,
)
from attnres_export.errors import ParityError
from attnres_export.graphs.external_data import external_locations
from attnres_export.graphs.external_save import save_with_external_data
from attnres_export.graphs.load import load_onnx
from attnres_export.graphs.validate import validate_attnres_nodes
from attnres_export.ops.descriptors import is_attnres

IN_MEMORY_BYTES = 256 << 20
"""Largest model handed to ONNX Runtime as serialized bytes."""


MATMUL_ACCURACY_KEY = "session.qdq_matmulnbits_accuracy_level"
"""ONNX Runtime fuses a blocked ``DequantizeLinear`` (4 or 8 bits, axis 0) feeding a ``MatMul`` into ``MatMulNBits``
with this ``accuracy_level``; its default, 4, quantizes the activations to int8
(docs/onnx-runtime-notes.md#dequantizelinear-and-matmulnbits)."""
FLOAT_ACTIVATIONS = 1
"""``accuracy_level`` 1: float32 activations, so a quantized graph computes the dequantized model it holds."""
INT8_ACTIVATIONS = 4
"""``accuracy_level`` 4: ONNX Runtime quantizes the activations to int8 per block at run time (the reference
emulates it: ``parity/int8_activations.py``)."""


class OnnxRuntimeRunner(Runner):
    """ONNX Runtime on the CPU (or another provider).

    A model with attnres nodes runs with their NumPy reference (onnxruntime-extensions); a bfloat16 model
    runs through the bfloat16 emulation (ONNX Runtime CPU has no bfloat16 arithmetic kernels).
    """

    name = "onnxruntime"

    def __init__(self, model: onnx.ModelProto | Path, providers: list[str] | None = None, artifact: str = "",
                 threads: int | None = None, matmul_accuracy: int = FLOAT_ACTIVATIONS) -> None:
        self.providers = providers or ["CPUExecutionProvider"]
        self.threads = threads
        """Intra-op threads (None: ONNX Runtime's default, one per core); benchmarks pin it to torch's count."""
        self.matmul_accuracy = matmul_accuracy
        """The ``accuracy_level`` of the ``MatMulNBits`` ONNX Runtime makes of a quantized weight's
        ``DequantizeLinear`` and ``MatMul`` (``MATMUL_ACCURACY_KEY``)."""
        self.artifact = artifact or (str(model) if isinstance(model, Path) else "")
        self.session = None
        self._path = model if isinstance(model, Path) else None
        if isinstance(model, Path):
            loaded = load_onnx(model, load_external_data=False)
        else:
            loaded = model
            validate_attnres_nodes(loaded, self.artifact or "the model")
        self.uses_reference_ops = any(is_attnres(node) for node in loaded.graph.node)
        self.emulates_bfloat16 = has_bfloat16(loaded)
        kind = self.name + ("+ref-ops" if self.uses_reference_ops else "")
        self.backend = kind + ("+bf16-emulation" if self.emulates_bfloat16 else "")
        self._model = loaded

    def activate(self) -> None:
        import onnxruntime as ort

        model = self._model
        beside = self._path if self._path is not None and external_locations(model) else None
        disabled: tuple[str, ...] = ()
        if self.emulates_bfloat16:
            model, disabled = emulate_bfloat16(model), SESSION_DISABLED_OPTIMIZERS
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.add_session_config_entry(MATMUL_ACCURACY_KEY, str(self.matmul_accuracy))
        if self.threads is not None:
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
        if self.uses_reference_ops:
            model = reference_ops.with_reference_ops(model)
            options.register_custom_ops_library(reference_ops.library_path())
        try:
            self.session = (_session(model, options, self.providers, disabled) if beside is None else
                            _session_beside(model, beside, options, self.providers, disabled))
        except Exception as exc:
            raise ParityError(f"ONNX Runtime could not load {self.artifact or 'the model'}: {exc}") from exc

    def infer(self, feeds: Feeds) -> Feeds:
        if self.session is None:
            raise ParityError("runner used before activate()")
        names = [o.name for o in self.session.get_outputs()]
        try:
            outputs = self.session.run(names, feeds)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
            raise ParityError(f"ONNX Runtime could not run {self.artifact or 'the model'} on inputs {shapes}: "
                              f"{first}") from exc
        return dict(zip(names, outputs, strict=True))

    def deactivate(self) -> None:
        self.session = None


def _session_beside(model: onnx.ModelProto, path: Path, options, providers: list[str],
                    disabled_optimizers: Sequence[str] = ()):
    """A session on ``model``, a weightless graph whose weights are the external data of the file at ``path``.

    ONNX Runtime reads external data only from the model's own folder (it refuses links out of it), so a graph
    rewritten for the session (reference ops) is written there under a private name and removed once the session
    has read it; where the folder is read-only, the weights are loaded and the model goes in whole."""
    import onnxruntime as ort

    try:
        with scratch_file_beside(path, ".ort.onnx") as sidecar:
            onnx.save_model(model, str(sidecar))
            return ort.InferenceSession(str(sidecar), options, providers=providers,
                                        disabled_optimizers=list(disabled_optimizers))
    except PermissionError:
        onnx.load_external_data_for_model(model, str(path.resolve().parent))
        return _session(model, options, providers, disabled_optimizers)


def _session(model: onnx.ModelProto, options, providers: list[str], disabled_optimizers: Sequence[str] = ()):
    """An ONNX Runtime session without ``disabled_optimizers``. A model over ``IN_MEMORY_BYTES`` goes through a
    temporary external-data file: serializing it in memory would hold its weights a second time (and protobuf
    stops at 2 GB)."""
    import onnxruntime as ort

    disabled = list(disabled_optimizers)
    if model.ByteSize() <= IN_MEMORY_BYTES:
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers,
                                    disabled_optimizers=disabled)
    with tempfile.TemporaryDirectory(prefix="attnres-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_with_external_data(model, path, "model.onnx.data")
        return ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=disabled)


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
