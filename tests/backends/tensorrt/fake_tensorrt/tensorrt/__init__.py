"""A strict fake of TensorRT's Python API (``import tensorrt``) for tests on machines without TensorRT or a GPU.

It mirrors the pybind11 bindings of NVIDIA/TensorRT at v10.3.0, v10.16 and v11.1 (python/src/infer/pyCore.cpp,
pyFoundationalTypes.cpp, pyGraph.cpp, pyPlugin.cpp and python/src/parsers/pyOnnx.cpp; each class names its file).
Strict: a class has only the members attnres uses, and only where that version binds them (``_bindings.MEMBERS``),
so anything else raises AttributeError as the real module does. ATTNRES_FAKE_TENSORRT picks the version
(10.3.0, 10.16.0 or 11.1.0) at import; tests/backends/tensorrt/conftest.py installs a fresh copy per test, and a
subprocess
finds it with this folder's parent on PYTHONPATH.

Behaviour is a model of what TensorRT documents, not of its internals:
- The ONNX parser reads the file with onnx. A node outside the ONNX domain is a plugin layer whose creator
  (op_type, plugin_version, plugin_namespace) must be registered; a model-local function of the same op_type is
  inlined instead before 10.7, and from 10.7 unless the node has plugin_namespace and the creator is registered
  (onnx-tensorrt's localFunctions rule).
- Plugin libraries are JSON files (``_plugin_library``): ``load_library`` takes only those exporting getCreators
  and refuses creators already registered; ``_dlopen`` is what ctypes.CDLL of a self-registering one does.
- An engine is ``_ENGINE_MAGIC`` + JSON. ``plugins_to_serialize`` is embedded only with
  BuilderFlag.VERSION_COMPATIBLE (NvInfer.h: "serialized with version-compatible engines"); such an engine carries
  the lean runtime, so it deserializes only with ``engine_host_code_allowed`` (trtexec's sampleEngines.cpp), and
  then also provides its embedded creators. Any other plugin the engine needs must be registered.
- A timing cache records the TensorRT version and the GPU it was made on: another version's cache is refused by
  ``create_timing_cache`` (None), another GPU's by ``set_timing_cache`` (False) unless ignore_mismatch.
- The engine inspector's JSON lists one layer per ONNX node (``_inspector_style`` switches plugin layers to a
  ``PluginType`` key, or folds every layer into one Myelin ``{ForeignNode[...]}`` layer).
Execution (IExecutionContext) is not faked: it needs a GPU.
"""

from __future__ import annotations

import enum as _enum
import json as _json
import os as _os
from pathlib import Path as _Path

from tensorrt import _bindings

_VERSION = _os.environ.get("ATTNRES_FAKE_TENSORRT", "10.16.0")
if _VERSION not in _bindings.VERSIONS:
    raise ImportError(f"ATTNRES_FAKE_TENSORRT={_VERSION!r}: the fake knows {', '.join(_bindings.VERSIONS)}")
__version__ = _VERSION
_MAJOR_MINOR = tuple(int(p) for p in _VERSION.split(".")[:2])

_DEVICE = "Fake GPU sm_90"
_ENGINE_MAGIC = b"FAKE-TENSORRT-ENGINE\n"
_CACHE_MAGIC = b"FAKE-TENSORRT-TIMING-CACHE\n"
_LIBRARY_FORMAT = "fake-tensorrt-plugin-library"
_inspector_style = "PluginV3"
"""How the inspector reports plugin layers: "PluginV3", "PluginType" (another LayerType plus a PluginType key) or
"Myelin" (every layer folded into one ForeignNode)."""


def _enum_of(name: str) -> type[_enum.IntEnum]:
    values = {k: v[_VERSION] for k, v in _bindings.ENUMS[name].items() if _VERSION in v}
    return _enum.IntEnum(name, values)


NetworkDefinitionCreationFlag = _enum_of("NetworkDefinitionCreationFlag")
BuilderFlag = _enum_of("BuilderFlag")
MemoryPoolType = _enum_of("MemoryPoolType")
ProfilingVerbosity = _enum_of("ProfilingVerbosity")
LayerInformationFormat = _enum_of("LayerInformationFormat")
TensorIOMode = _enum_of("TensorIOMode")
DataType = _enum_of("DataType")

_ONNX_TO_DATATYPE = {1: "FLOAT", 10: "HALF", 16: "BF16", 7: "INT64", 6: "INT32", 3: "INT8", 2: "UINT8", 9: "BOOL"}


def _type_error(what: str, value) -> TypeError:
    return TypeError(f"{what}(): incompatible function arguments; got {type(value).__name__}")


# --- pyCore.cpp: loggers -------------------------------------------------------------------------------------


class ILogger:
    """python/src/infer/pyCore.cpp ``py::class_<ILogger, PyLogger>``; Severity values exported into the class."""

    __slots__ = ()
    Severity = _enum.IntEnum("Severity", {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4})
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity

    def log(self, severity, msg) -> None:
        raise NotImplementedError


class Logger(ILogger):
    """python/src/infer/pyCore.cpp ``py::class_<DefaultLogger, ILogger>(m, "Logger")``: prints like TensorRT."""

    __slots__ = ("min_severity",)

    def __init__(self, min_severity=ILogger.WARNING) -> None:
        self.min_severity = min_severity

    def log(self, severity, msg) -> None:
        if int(severity) <= int(self.min_severity):
            print(f"[TRT] [{'FEWIV'[int(severity)]}] {msg}")


def _check_logger(logger) -> ILogger:
    if not isinstance(logger, ILogger):
        raise _type_error("__init__", logger)
    return logger


# --- pyFoundationalTypes.cpp ---------------------------------------------------------------------------------


class IHostMemory(bytes):
    """python/src/infer/pyFoundationalTypes.cpp ``py::class_<IHostMemory>(..., py::buffer_protocol())``.

    A bytes subclass only for the buffer protocol (Python 3.11 classes cannot provide it otherwise); bytes'
    own methods are hidden, as the real class has none of them.
    """

    __slots__ = ()

    def __getattribute__(self, name: str):
        if not name.startswith("_") and name not in _available("IHostMemory"):
            raise AttributeError(f"'tensorrt.IHostMemory' object has no attribute '{name}'")
        return super().__getattribute__(name)


# --- pyGraph.cpp, pyOnnx.cpp: network and parser ---------------------------------------------------------------


class INetworkDefinition:
    """python/src/infer/pyGraph.cpp ``py::class_<INetworkDefinition>``: holds what the parser found."""

    __slots__ = ("_inputs", "_layers", "_outputs", "_strongly_typed")

    def __init__(self, strongly_typed: bool) -> None:
        self._strongly_typed = strongly_typed
        self._inputs: list[dict] = []
        self._outputs: list[dict] = []
        self._layers: list[dict] = []


class ParserError:
    """python/src/parsers/pyOnnx.cpp ``py::class_<IParserError>(m, "ParserError")``."""

    __slots__ = ("_desc",)

    def __init__(self, desc: str) -> None:
        self._desc = desc

    def desc(self) -> str:
        return self._desc


class OnnxParser:
    """python/src/parsers/pyOnnx.cpp ``py::class_<IParser>(m, "OnnxParser")``."""

    __slots__ = ("_errors", "_logger", "_network")

    def __init__(self, network, logger) -> None:
        if not isinstance(network, INetworkDefinition):
            raise _type_error("__init__", network)
        self._network = network
        self._logger = _check_logger(logger)
        self._errors: list[ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index):
        return self._errors[index]

    def parse_from_file(self, model) -> bool:
        import onnx

        try:
            proto = onnx.load(str(model), load_external_data=False)
        except Exception:
            return self._fail(f"Failed to parse ONNX model from file: {model}")
        graph = proto.graph
        initializers = {i.name for i in graph.initializer}
        network = self._network
        network._inputs = [_tensor(v) for v in graph.input if v.name not in initializers]
        network._outputs = [_tensor(v) for v in graph.output]
        if any(t["dtype"] is None for t in network._inputs + network._outputs):
            return self._fail("a network input or output has a type TensorRT does not take")
        functions = {f.name: f for f in proto.functions}
        for index, node in enumerate(graph.node):
            name = node.name or f"node_{index}"
            if node.domain in ("", "ai.onnx"):
                network._layers.append({"name": name, "type": node.op_type})
                continue
            key = [node.op_type, _string_attribute(node, "plugin_version", "1"),
                   _string_attribute(node, "plugin_namespace", "")]
            registered = tuple(key) in _registry._creators
            plugin_first = (_MAJOR_MINOR >= (10, 7) and registered
                            and any(a.name == "plugin_namespace" for a in node.attribute))
            if node.op_type in functions and not plugin_first:
                network._layers.extend({"name": f"{name}/{inner.op_type}_{i}", "type": inner.op_type}
                                       for i, inner in enumerate(functions[node.op_type].node))
            elif registered:
                network._layers.append({"name": name, "plugin": key})
            else:
                return self._fail(f"In node {index} with name: {name} and operator: {node.op_type} (importFallback"
                                  "PluginImporter): UNSUPPORTED_NODE: Assertion failed: creator && \"Plugin not "
                                  "found, are the plugin name, version, and namespace correct?\"")
        return True

    def _fail(self, desc: str) -> bool:
        self._errors.append(ParserError(desc))
        self._logger.log(ILogger.ERROR, desc)
        return False


def _tensor(value) -> dict:
    kind = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in kind.shape.dim]
    return {"name": value.name, "dtype": _ONNX_TO_DATATYPE.get(kind.elem_type), "shape": dims}


def _string_attribute(node, name: str, default: str) -> str:
    for attribute in node.attribute:
        if attribute.name == name:
            return attribute.s.decode()
    return default


# --- pyCore.cpp: builder -----------------------------------------------------------------------------------------


class IOptimizationProfile:
    """python/src/infer/pyCore.cpp ``py::class_<IOptimizationProfile>``; set_shape raises like its lambda."""

    __slots__ = ("_shapes",)

    def __init__(self) -> None:
        self._shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, input, min, opt, max) -> None:
        shapes = [[int(d) for d in dims] for dims in (min, opt, max)]
        for label, dims in zip(("min", "opt"), shapes[:2], strict=True):
            if len(dims) != len(shapes[2]) or any(a > b for a, b in zip(dims, shapes[2], strict=True)):
                raise RuntimeError(f"Shape provided for {label} is inconsistent with other shapes.")
        if any(a > b for a, b in zip(shapes[0], shapes[1], strict=True)):
            raise RuntimeError("Shape provided for min is inconsistent with other shapes.")
        self._shapes[str(input)] = shapes


class ITimingCache:
    """python/src/infer/pyCore.cpp ``py::class_<ITimingCache>``: the version and GPU it was made on, its entries."""

    __slots__ = ("_device", "_entries", "_version")

    def __init__(self, version: str, device: str, entries: int) -> None:
        self._version, self._device, self._entries = version, device, entries

    def serialize(self) -> IHostMemory:
        return IHostMemory(_timing_cache_blob(self._version, self._device, self._entries))


def _timing_cache_blob(version: str, device: str, entries: int = 0) -> bytes:
    """A serialized fake timing cache (tests make foreign ones with it)."""
    return _CACHE_MAGIC + _json.dumps({"tensorrt": version, "device": device, "entries": entries}).encode()


class IBuilderConfig:
    """python/src/infer/pyCore.cpp ``py::class_<IBuilderConfig>``."""

    __slots__ = ("_cache", "_flags", "_logger", "_opt_level", "_plugins", "_pools", "_profiles", "_verbosity")

    def __init__(self, logger: ILogger) -> None:
        self._logger = logger
        self._verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self._pools: dict[str, int] = {}
        self._opt_level = 3
        self._profiles: list[IOptimizationProfile] = []
        self._cache: ITimingCache | None = None
        self._plugins: list[str] = []
        self._flags: set[str] = set()

    @property
    def profiling_verbosity(self):
        return self._verbosity

    @profiling_verbosity.setter
    def profiling_verbosity(self, value) -> None:
        self._verbosity = ProfilingVerbosity(value)

    def set_memory_pool_limit(self, pool, pool_size) -> None:
        if not isinstance(pool, MemoryPoolType):
            raise _type_error("set_memory_pool_limit", pool)
        self._pools[pool.name] = int(pool_size)

    @property
    def builder_optimization_level(self) -> int:
        return self._opt_level

    @builder_optimization_level.setter
    def builder_optimization_level(self, value) -> None:
        self._opt_level = int(value)

    def add_optimization_profile(self, profile) -> int:
        if not isinstance(profile, IOptimizationProfile):
            raise _type_error("add_optimization_profile", profile)
        if not profile._shapes:
            self._logger.log(ILogger.ERROR, "addOptimizationProfile: the profile has no shapes")
            return -1
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache):
        data = bytes(memoryview(serialized_timing_cache))
        if not data:
            return ITimingCache(_VERSION, _DEVICE, 0)
        try:
            header = _json.loads(data[len(_CACHE_MAGIC):]) if data.startswith(_CACHE_MAGIC) else None
        except ValueError:
            header = None
        if header is None or header.get("tensorrt") != _VERSION:
            self._logger.log(ILogger.ERROR, "createTimingCache: the serialized timing cache is invalid or was made "
                                            "by another TensorRT version")
            return None
        return ITimingCache(header["tensorrt"], header["device"], header["entries"])

    def set_timing_cache(self, cache, ignore_mismatch) -> bool:
        if not isinstance(cache, ITimingCache):
            raise _type_error("set_timing_cache", cache)
        if cache._device != _DEVICE and not ignore_mismatch:
            self._logger.log(ILogger.ERROR, "setTimingCache: the timing cache was made on another device")
            return False
        self._cache = cache
        return True

    def get_timing_cache(self):
        return self._cache

    @property
    def plugins_to_serialize(self) -> list[str]:
        return list(self._plugins)

    @plugins_to_serialize.setter
    def plugins_to_serialize(self, value) -> None:
        if isinstance(value, str | bytes) or not all(isinstance(p, str) for p in value):
            raise _type_error("plugins_to_serialize", value)
        self._plugins = list(value)

    def set_flag(self, flag) -> None:
        if not isinstance(flag, BuilderFlag):
            raise _type_error("set_flag", flag)
        self._flags.add(flag.name)


class Builder:
    """python/src/infer/pyCore.cpp ``py::class_<IBuilder>(m, "Builder")``."""

    __slots__ = ("_logger",)

    def __init__(self, logger) -> None:
        self._logger = _check_logger(logger)

    def create_network(self, flags=0) -> INetworkDefinition:
        strongly_typed = 1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        return INetworkDefinition(_MAJOR_MINOR >= (11, 0) or bool(int(flags) & strongly_typed))

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self._logger)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(self, network, config):
        if not isinstance(network, INetworkDefinition) or not isinstance(config, IBuilderConfig):
            raise _type_error("build_serialized_network", network)
        problem = _profile_problem(network, config)
        if problem is None and not network._outputs:
            problem = "Network must have at least one output"
        embedded = []
        if problem is None and "VERSION_COMPATIBLE" in config._flags:
            for path in config._plugins:
                library = _read_library(path)
                if library is None or not library["get_creators"]:
                    problem = f"{path} cannot be serialized: not a plugin library exporting getCreators"
                    break
                embedded.append({"path": path, "creators": library["creators"]})
        if problem is not None:
            self._logger.log(ILogger.ERROR, problem)
            return None
        if config._cache is not None:
            config._cache._entries += len(network._layers)
        payload = {
            "tensorrt": _VERSION, "strongly_typed": network._strongly_typed, "inputs": network._inputs,
            "outputs": network._outputs, "layers": network._layers, "verbosity": config._verbosity.name,
            "profiles": [p._shapes for p in config._profiles], "opt_level": config._opt_level,
            "pools": config._pools, "flags": sorted(config._flags), "embedded": embedded,
            "timing_cache": config._cache is not None,
        }
        return IHostMemory(_ENGINE_MAGIC + _json.dumps(payload).encode())


def _profile_problem(network: INetworkDefinition, config: IBuilderConfig) -> str | None:
    dynamic = [t for t in network._inputs if -1 in t["shape"]]
    if dynamic and not config._profiles:
        return "Network has dynamic or shape inputs, but no optimization profile has been defined."
    names = {t["name"]: t for t in network._inputs}
    for index, profile in enumerate(config._profiles):
        for name in profile._shapes:
            if name not in names:
                return f"Optimization profile {index} names {name}, which is not a network input"
        for tensor in dynamic:
            shapes = profile._shapes.get(tensor["name"])
            if shapes is None:
                return f"Optimization profile {index} is missing values for input {tensor['name']}"
            for dims in shapes:
                if len(dims) != len(tensor["shape"]) or any(
                        d != s for d, s in zip(dims, tensor["shape"], strict=True) if s != -1):
                    return f"Optimization profile {index}: {tensor['name']} {dims} does not match {tensor['shape']}"
    return None


# --- pyCore.cpp: runtime and engine ------------------------------------------------------------------------------


class Runtime:
    """python/src/infer/pyCore.cpp ``py::class_<IRuntime>(m, "Runtime")``."""

    __slots__ = ("_host_code", "_logger")

    def __init__(self, logger) -> None:
        self._logger = _check_logger(logger)
        self._host_code = False

    @property
    def engine_host_code_allowed(self) -> bool:
        return self._host_code

    @engine_host_code_allowed.setter
    def engine_host_code_allowed(self, value) -> None:
        self._host_code = bool(value)

    def deserialize_cuda_engine(self, serialized_engine):
        payload = _engine_payload(bytes(memoryview(serialized_engine)))
        problem = None
        if payload is None:
            problem = "The engine plan file is not a TensorRT engine (magic tag mismatch)"
        elif payload["tensorrt"] != _VERSION and not (
                "VERSION_COMPATIBLE" in payload["flags"] and _bindings.VERSIONS.index(payload["tensorrt"])
                <= _bindings.VERSIONS.index(_VERSION)):
            problem = f"The engine plan file is not compatible with this version of TensorRT ({payload['tensorrt']})"
        elif "VERSION_COMPATIBLE" in payload["flags"] and not self._host_code:
            problem = ("Engine has host code (the lean runtime of a version-compatible engine); "
                       "set engine_host_code_allowed to deserialize it")
        else:
            available = set(_registry._creators)
            available |= {tuple(c) for lib in payload["embedded"] for c in lib["creators"]}
            for layer in payload["layers"]:
                if "plugin" in layer and tuple(layer["plugin"]) not in available:
                    name, version, namespace = layer["plugin"]
                    problem = (f"getPluginCreator could not find plugin: {name} version: {version} "
                               f"namespace: {namespace}")
                    break
        if problem is not None:
            self._logger.log(ILogger.ERROR, problem)
            return None
        return ICudaEngine(payload)


def _engine_payload(data: bytes) -> dict | None:
    """The JSON inside a fake engine, or None for anything else (tests read profiles and flags with it)."""
    if not data.startswith(_ENGINE_MAGIC):
        return None
    return _json.loads(data[len(_ENGINE_MAGIC):])


class ICudaEngine:
    """python/src/infer/pyCore.cpp ``py::class_<ICudaEngine>``."""

    __slots__ = ("_payload", "_tensors")

    def __init__(self, payload: dict) -> None:
        self._payload = payload
        self._tensors = {t["name"]: (TensorIOMode.INPUT, t) for t in payload["inputs"]}
        self._tensors |= {t["name"]: (TensorIOMode.OUTPUT, t) for t in payload["outputs"]}

    @property
    def num_io_tensors(self) -> int:
        return len(self._tensors)

    def get_tensor_name(self, index) -> str:
        return list(self._tensors)[index]

    def get_tensor_mode(self, name):
        return self._tensors[name][0] if name in self._tensors else TensorIOMode.NONE

    def get_tensor_dtype(self, name):
        return DataType[self._tensors[name][1]["dtype"]]

    def get_tensor_shape(self, name) -> tuple[int, ...]:
        return tuple(self._tensors[name][1]["shape"])

    def get_tensor_profile_shape(self, name, profile_index) -> list[tuple[int, ...]]:
        return [tuple(dims) for dims in self._payload["profiles"][profile_index][name]]

    def create_engine_inspector(self):
        return EngineInspector(self._payload)


class EngineInspector:
    """python/src/infer/pyCore.cpp ``py::class_<IEngineInspector>(m, "EngineInspector")``."""

    __slots__ = ("_payload",)

    def __init__(self, payload: dict) -> None:
        self._payload = payload

    def get_engine_information(self, format) -> str:
        verbosity = self._payload["verbosity"]
        layers = self._payload["layers"]
        if verbosity == "DETAILED":
            described = _detailed_layers(layers)
        else:
            described = [] if verbosity == "NONE" else [layer["name"] for layer in layers]
        if LayerInformationFormat(format) == LayerInformationFormat.ONELINE:
            return "\n".join(str(layer) for layer in described)
        bindings = [t["name"] for t in self._payload["inputs"] + self._payload["outputs"]]
        return _json.dumps({"Layers": described, "Bindings": bindings})


def _detailed_layers(layers: list[dict]) -> list[dict]:
    if _inspector_style == "Myelin":
        return [{"Name": f"{{ForeignNode[{layers[0]['name']}...{layers[-1]['name']}]}}", "LayerType": "Myelin"}]
    described = []
    for layer in layers:
        if "plugin" not in layer:
            described.append({"Name": layer["name"], "LayerType": layer["type"]})
        elif _inspector_style == "PluginType":
            described.append({"Name": layer["name"], "LayerType": "Plugin", "PluginType": layer["plugin"][0]})
        else:
            described.append({"Name": layer["name"], "LayerType": "PluginV3"})
    return described


# --- pyPlugin.cpp: the plugin registry ---------------------------------------------------------------------------


class IPluginCreatorV3One:
    """python/src/infer/pyPlugin.cpp ``py::class_<IPluginCreatorV3One>``."""

    __slots__ = ("_key",)

    def __init__(self, key: tuple[str, str, str]) -> None:
        self._key = key

    @property
    def name(self) -> str:
        return self._key[0]

    @property
    def plugin_version(self) -> str:
        return self._key[1]

    @property
    def plugin_namespace(self) -> str:
        return self._key[2]


class _LibraryHandle:
    """What ``load_library`` returns in place of the real ``void*`` capsule."""

    __slots__ = ("_path",)

    def __init__(self, path: str) -> None:
        self._path = path


class IPluginRegistry:
    """python/src/infer/pyPlugin.cpp ``py::class_<IPluginRegistry>``; one per process, as in TensorRT."""

    __slots__ = ("_creators",)

    def __init__(self) -> None:
        self._creators: dict[tuple[str, str, str], IPluginCreatorV3One] = {}

    @property
    def all_creators(self) -> list:
        return list(self._creators.values())

    @property
    def plugin_creator_list(self) -> list:
        return []  # IPluginV2 (V1) creators only; every creator here is a V3One

    def load_library(self, plugin_path):
        library = _read_library(plugin_path)
        if library is None or not library["get_creators"]:
            return None
        keys = [tuple(c) for c in library["creators"]]
        if any(k in self._creators for k in keys):
            return None
        self._creators.update((k, IPluginCreatorV3One(k)) for k in keys)
        return _LibraryHandle(str(plugin_path))


_registry = IPluginRegistry()


def get_plugin_registry() -> IPluginRegistry:
    """python/src/infer/pyPlugin.cpp ``m.def("get_plugin_registry", ...)``."""
    return _registry


def _plugin_library(creators: list[tuple[str, str, str]], dynamic: bool) -> str:
    """The text of a fake plugin library: the _dyn kind exports getCreators, the other registers when dlopened."""
    return _json.dumps({"format": _LIBRARY_FORMAT, "creators": [list(c) for c in creators],
                        "get_creators": dynamic, "self_registering": not dynamic})


def _read_library(path) -> dict | None:
    try:
        data = _json.loads(_Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == _LIBRARY_FORMAT else None


def _dlopen(path) -> object:
    """What ``ctypes.CDLL(path, RTLD_GLOBAL)`` does to a plugin library: static registration, or OSError."""
    library = _read_library(path)
    if library is None:
        raise OSError(f"{path}: invalid ELF header")
    if library["self_registering"]:
        for key in map(tuple, library["creators"]):
            _registry._creators.setdefault(key, IPluginCreatorV3One(key))
    return _LibraryHandle(str(path))


# --- strictness: remove every member this version does not bind ----------------------------------------------------


def _available(name: str) -> set[str]:
    return {m for m, versions in _bindings.MEMBERS[name].items() if _VERSION in versions}


def _prune() -> None:
    for name in _bindings.MEMBERS:
        cls = globals()[name]
        public = {m for m in vars(cls) if not m.startswith("_")}
        untabled = public - set(_bindings.MEMBERS[name])
        if untabled:
            raise ImportError(f"fake {name} implements {sorted(untabled)} without a binding entry")
        for member in public - _available(name):
            delattr(cls, member)


_prune()
