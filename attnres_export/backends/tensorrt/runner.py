"""A TensorRT engine behind the runner interface: plugin loaded, shapes set, torch CUDA buffers, execute_async_v3.

torch is already a dependency and owns a CUDA context and streams, so its tensors serve as device buffers
(no pycuda or cuda-python needed). TensorRT and CUDA are touched only when the engine loads (``load``,
``activate``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnres_export.backends.base import Runner
from attnres_export.backends.tensorrt import plugin_library
from attnres_export.backends.tensorrt.api import logger, require_tensorrt
from attnres_export.backends.tensorrt.manifest import EngineManifest, manifest_path, read_manifest, sha256_file
from attnres_export.dtypes import STORAGE_TYPES, TENSORRT_TO_NAME
from attnres_export.errors import EngineError


def _cuda_torch():
    import torch

    if not torch.cuda.is_available():
        raise EngineError("running a TensorRT engine needs a CUDA GPU, and torch sees none here "
                          "(torch.cuda.is_available() is False); install a CUDA build of torch on the GPU machine")
    return torch


class TensorRTRunner(Runner):
    """One deserialized engine; ``bind`` + ``enqueue`` are exposed so the benchmark can time the launch alone.

    Engines without a manifest (built by trtexec or Polygraphy) run with ``plugin`` given explicitly. The manifest's
    library is loaded only while its sha256 matches the manifest's, and engine host code (an embedded plugin, the
    lean runtime of a version-compatible engine) runs only when the caller allows it, never because the manifest
    says so: the manifest is a file beside the engine that anyone can edit.
    """

    backend = "tensorrt"

    def __init__(self, engine: Path, plugin: Path | None = None, manifest: EngineManifest | None = None,
                 allow_engine_host_code: bool = False) -> None:
        self.path = Path(engine)
        self.artifact = self.path.name
        self.plugin = plugin
        self.manifest = manifest if manifest is not None else read_manifest(self.path)
        self.allow_engine_host_code = allow_engine_host_code
        self.engine = self.context = self.stream = self.runtime = None
        self.buffers: dict = {}

    def load(self) -> None:
        """Load the plugin library and deserialize the engine (once); ``activate`` adds a context and a stream."""
        if self.engine is not None:
            return
        if not self.path.is_file():
            raise EngineError(f"{self.path}: no such engine file; build one with `attnres build MODEL.onnx`")
        library = self.plugin_to_load()
        trt = require_tensorrt()
        _cuda_torch()
        if library is not None:
            plugin_library.load(trt, library)
        self.runtime = trt.Runtime(logger(trt))
        if self.allow_engine_host_code:
            self.runtime.engine_host_code_allowed = True
        self.engine = self.runtime.deserialize_cuda_engine(self.path.read_bytes())
        if self.engine is None:
            raise EngineError(self._load_failure(trt))

    def activate(self) -> None:
        self.load()
        torch = _cuda_torch()
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()

    def plugin_to_load(self) -> Path | None:
        """The library to load before deserializing: --plugin; else the manifest's, if unchanged since the build,
        unless its plugin is embedded and engine host code is allowed."""
        if self.plugin is not None:
            return Path(self.plugin)
        manifest = self.manifest
        if manifest is None:
            raise EngineError(f"{self.artifact} has no manifest {manifest_path(self.path).name} (written by `attnres "
                              "build`) naming its plugin library; pass --plugin LIB, the library it was built with")
        if (manifest.plugin_embedded and self.allow_engine_host_code) or not manifest.plugin_library:
            return None
        library = Path(manifest.plugin_library)
        if not library.is_file():
            embedded = ("its plugin is embedded: pass --allow-engine-host-code if you built or trust the engine, "
                        "or " if manifest.plugin_embedded else "")
            raise EngineError(f"{self.artifact} needs the plugin library {library} (named in its manifest), which "
                              f"is missing; {embedded}rebuild it (`attnres plugin build`) or pass --plugin PATH")
        if sha256_file(library) != manifest.plugin_sha256:
            raise EngineError(f"{library} is not the plugin library {self.artifact} was built with (its sha256 differs "
                              f"from {manifest_path(self.path).name}'s); pass --plugin {library} if you trust it")
        return library

    def _load_failure(self, trt) -> str:
        built = self.manifest.tensorrt_version if self.manifest else "an unknown version"
        library = self.plugin or (self.manifest.plugin_library if self.manifest else None)
        needs_host_code = self.manifest is not None and self.manifest.version_compatible
        fix = ("it is version compatible (--embed-plugin) and so carries host code, which runs only with "
               "--allow-engine-host-code: pass it if you built or trust the engine"
               if needs_host_code and not self.allow_engine_host_code
               else "rebuild it on this machine with `attnres build`, or load the plugin with --plugin")
        return (f"TensorRT {trt.__version__} could not deserialize {self.artifact} (built with TensorRT {built}"
                + (f", plugin {library}" if library else "") + f"); {fix}")

    def storage_dtype(self, stated: str | None = None) -> str | None:
        """The dtype the engine was exported in (it picks the pass bar): the manifest's; else ``stated`` (the
        caller's word for an engine built by trtexec or Polygraphy); else what the engine's inputs and outputs tell,
        or None when they tell nothing. ``stated`` is refused when the manifest or the I/O says otherwise."""
        if self.manifest is not None:
            if stated is not None and stated != self.manifest.dtype:
                raise EngineError(f"{self.artifact} was built from a {self.manifest.dtype} ONNX (its manifest "
                                  f"{manifest_path(self.path).name}); it is not {stated}")
            return self.manifest.dtype
        told = self._io_dtype()
        if stated is not None and told is not None and stated != told:
            raise EngineError(f"{self.artifact}'s input and output types say it was exported in {told}, not {stated}; "
                              f"pass --engine-dtype {told}, or leave it out")
        return stated or told

    def _io_dtype(self) -> str | None:
        """The storage dtype the engine's I/O tensors prove, or None. An attnres export writes its logits (and
        RealFormer's hidden states) in float32 whatever its dtype, so a float32 output proves nothing; a float16 or
        bfloat16 tensor, or a float32 input (a with-past export's cache is in the export dtype), does."""
        self.load()
        halves, float32_input = set(), False
        for is_input in (True, False):
            for name in self.io_names(is_input):
                kind = TENSORRT_TO_NAME.get(self.engine.get_tensor_dtype(name).name)
                if kind in STORAGE_TYPES and kind != "float32":
                    halves.add(kind)
                float32_input |= is_input and kind == "float32"
        if len(halves) == 1:
            return halves.pop()
        return "float32" if float32_input and not halves else None

    def input_axes(self) -> dict[str, list[str | int]]:
        """Each input's axes: the manifest's labels, else the engine's dims with dynamic axes 0 and 1 read as
        batch and seq (how attnres-export lays out its inputs)."""
        if self.manifest is not None:
            return self.manifest.input_axes
        self.load()
        axes = {}
        for name in self.io_names(True):
            dims = list(self.engine.get_tensor_shape(name))
            if any(d < 0 for d in dims[2:]):
                raise EngineError(f"{self.artifact}: input {name!r} has dims {dims}; without a manifest only axes 0 "
                                  "(batch) and 1 (seq) may be dynamic")
            axes[name] = [("batch", "seq")[i] if d < 0 else d for i, d in enumerate(dims)]
        return axes

    def io_names(self, input_mode: bool) -> list[str]:
        trt = require_tensorrt()
        wanted = trt.TensorIOMode.INPUT if input_mode else trt.TensorIOMode.OUTPUT
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        return [n for n in names if self.engine.get_tensor_mode(n) == wanted]

    def _torch_dtype(self, name: str):
        torch = _cuda_torch()
        kind = self.engine.get_tensor_dtype(name).name
        if kind not in TENSORRT_TO_NAME:
            raise EngineError(f"engine tensor {name!r} has type {kind}, which this runner cannot allocate")
        return getattr(torch, TENSORRT_TO_NAME[kind])

    def input_dtype(self, name: str) -> str:
        """NumPy dtype name to feed ``name`` with (bfloat16 inputs are fed as float32 and cast on the device)."""
        kind = TENSORRT_TO_NAME.get(self.engine.get_tensor_dtype(name).name, "float32")
        return "float32" if kind == "bfloat16" else kind

    def bind(self, feeds: dict[str, np.ndarray]) -> None:
        """Set input shapes, copy the inputs to the device and allocate the outputs."""
        if self.context is None:
            raise EngineError("runner used before activate()")
        torch = _cuda_torch()
        self.buffers = {}
        for name in self.io_names(True):
            if name not in feeds:
                raise EngineError(f"engine input {name!r} was not fed (fed: {', '.join(feeds)})")
            array = feeds[name]
            if not self.context.set_input_shape(name, tuple(array.shape)):
                profile = self.manifest.profiles if self.manifest else "see the build log"
                raise EngineError(f"input {name!r} shape {list(array.shape)} is outside the engine's profile "
                                  f"({profile}); rebuild with wider --batch/--seq")
            tensor = torch.from_numpy(np.ascontiguousarray(array)).to("cuda", self._torch_dtype(name))
            self.buffers[name] = tensor
        for name in self.io_names(False):
            shape = tuple(self.context.get_tensor_shape(name))
            self.buffers[name] = torch.empty(shape, dtype=self._torch_dtype(name), device="cuda")
        for name, tensor in self.buffers.items():
            self.context.set_tensor_address(name, tensor.data_ptr())
        torch.cuda.current_stream().synchronize()

    def enqueue(self) -> None:
        """Launch one inference on ``self.stream`` (asynchronous)."""
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise EngineError(f"TensorRT failed to enqueue {self.artifact}; rerun with --debug and check the log")

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.bind(feeds)
        self.enqueue()
        self.stream.synchronize()
        outputs = {}
        for name in self.io_names(False):
            tensor = self.buffers[name]
            outputs[name] = (tensor.float() if tensor.is_floating_point() else tensor).cpu().numpy()
        return outputs

    def deactivate(self) -> None:
        self.buffers = {}
        self.context = self.engine = self.runtime = None
