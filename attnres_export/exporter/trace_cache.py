"""The trace cache of the assembled export (docs/exporter-notes.md#the-trace-cache).

``piece_trace.trace_kinds`` traces the first piece of each kind with its weights as graph inputs, so the combined
trace is a function of the code that runs, the libraries' versions, the pieces' structure and the export's dims,
dtype and opset, never of a weight's value: another checkpoint of an architecture, or another run of the same one,
can read the trace from disk and skip torch.onnx (and its imports). The key hashes all of that; what it cannot
describe exactly (an object whose repr holds a memory address, a class from outside the libraries it versions, a
tensor left on the meta device that is no weight) leaves the trace uncached rather than risk a wrong hit. An entry is
an ONNX ModelProto, only ever parsed; one that does not parse or whose digest differs is traced again and replaced.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import enum
import functools
import hashlib
import importlib.util
import json
import os
import platform
import sys
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import torch
from torch import nn

import attnres_export
from attnres_export.atomic import atomic_write

ENVIRONMENT = "ATTNRES_TRACE_CACHE"
"""The cache folder, or ``off``."""
FORMAT = 1
"""Bumped when the key or the entries change meaning, so that older entries are never read."""
LIBRARIES = {"torch": "torch", "onnxscript": "onnxscript", "onnx_ir": "onnx-ir", "onnx": "onnx", "sympy": "sympy",
             "numpy": "numpy", "ml_dtypes": "ml-dtypes"}
"""Top-level module -> distribution of the libraries a trace runs: their versions are in the key, and objects of
their classes (and of attnres_export's and the standard library's) are the only ones the key describes."""
ENVIRONMENT_PREFIXES = ("TORCH", "PYTORCH", "ONNX", "SYMPY")
"""Environment variables that torch, torch.onnx, onnxscript (``TORCHLIB_*``) or sympy read: all of them are keyed,
but for ``TORCHINDUCTOR_*``, which only torch.compile reads and torch sets itself when torch._dynamo is imported."""
KEEP_BYTES = 256 << 20
"""The most the folder holds: a write removes the least recently used entries beyond it (an entry is a few tens of
KB, and every upgrade of attnres or of a library keys new ones)."""
_KEY, _DIGEST = "attnres.trace_key", "attnres.trace_digest"
_MAX_DEPTH = 64


class Uncacheable(Exception):
    """The trace reads something the key cannot describe exactly; the message says what."""


def cache_folder(enabled: bool = True) -> Path | None:
    """``$ATTNRES_TRACE_CACHE``, else ``$XDG_CACHE_HOME/attnres/traces`` or ``~/.cache/attnres/traces``; None when
    ``enabled`` is False (``--no-trace-cache``) or the variable is ``off``."""
    chosen = os.environ.get(ENVIRONMENT, "")
    if not enabled or chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    try:
        base = Path(xdg) if Path(xdg).is_absolute() else Path.home() / ".cache"
    except RuntimeError:  # no home folder to put it in
        return None
    return base / "attnres" / "traces"


def entry_path(folder: Path, key: str) -> Path:
    return folder / f"{key}.onnx"


def trace_key(traced: object) -> str:
    """The sha256 key of a trace of ``traced`` (what the trace reads: the pieces, their modules, the dims, dtype and
    opset) by this code, these libraries, in this process's settings; raises Uncacheable."""
    description = [FORMAT, _process(), _Describer().describe(traced, "the trace", 0)]
    return hashlib.sha256(json.dumps(description, separators=(",", ":")).encode()).hexdigest()


def read_trace(folder: Path, key: str) -> ir.Model | None:
    """The trace stored under ``key``, or None when there is none or it is unreadable, cut short or altered."""
    try:
        proto = onnx.ModelProto.FromString(entry_path(folder, key).read_bytes())
        stamps = {p.key: p.value for p in proto.metadata_props if p.key in (_KEY, _DIGEST)}
        kept = [p for p in proto.metadata_props if p.key not in (_KEY, _DIGEST)]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
        if stamps != {_KEY: key, _DIGEST: hashlib.sha256(proto.SerializeToString()).hexdigest()}:
            return None
        model = ir.serde.deserialize_model(proto)
        with contextlib.suppress(OSError):  # used now, the last to be evicted (unless the folder is read-only)
            os.utime(entry_path(folder, key))
        return model
    except Exception:  # whatever is wrong with an entry (a folder in its place, bad protobuf): trace again
        return None


def write_trace(folder: Path, key: str, model: ir.Model) -> Path:
    """Store ``model`` under ``key`` (atomically: a reader sees the whole entry or none), stamped with its key and
    the digest of the rest; the folder is made private to the user (its entries become parts of exports)."""
    proto = ir.serde.serialize_model(model)
    digest = hashlib.sha256(proto.SerializeToString()).hexdigest()
    proto.metadata_props.add(key=_KEY, value=key)
    proto.metadata_props.add(key=_DIGEST, value=digest)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = entry_path(folder, key)
    with atomic_write(path) as tmp:
        tmp.write_bytes(proto.SerializeToString())
    evict(folder, keep=path)
    return path


def evict(folder: Path, keep: Path, keep_bytes: int | None = None) -> list[Path]:
    """Remove the least recently used entries until the folder's entries hold at most ``keep_bytes`` (default
    ``KEEP_BYTES``; ``keep``, the entry just written, stays); returns what was removed. Another process may remove
    the same entry first."""
    keep_bytes = KEEP_BYTES if keep_bytes is None else keep_bytes
    entries = []
    for path in folder.glob("*.onnx"):
        with contextlib.suppress(OSError):
            stat = path.stat()
            entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, path in sorted(entries, key=lambda entry: entry[0]):
        if total <= keep_bytes:
            break
        if path == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
        total -= size
    return removed


@functools.cache
def source_hash() -> str:
    """sha256 of every ``.py`` file of attnres_export, by its path in the package: the code that builds, traces and
    translates the pieces."""
    root = _package_root()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _package_root() -> Path:
    return Path(attnres_export.__file__).resolve().parent


def _process() -> list:
    """What the trace depends on besides the pieces: code, library versions, interpreter and torch settings."""
    root = _package_root()
    for name, module in list(sys.modules.items()):
        if name == "attnres_export" or name.startswith("attnres_export."):
            file = getattr(module, "__file__", None)
            if file is None or not file.endswith(".py") or not Path(file).resolve().is_relative_to(root):
                raise Uncacheable(f"module {name} is not loaded from a source file of {root}")
    # torch's private state, read defensively: a torch without it leaves the trace uncached, not the export failed
    modes = [getattr(torch._C, name, None) for name in ("_len_torch_function_stack", "_len_torch_dispatch_stack")]
    if None in modes or any(count() for count in modes):
        raise Uncacheable("a torch function or dispatch mode may be active")
    hooks = [getattr(nn.modules.module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks")]
    if None in hooks or any(hooks):
        raise Uncacheable("global module forward hooks may be registered")
    _refuse_active_context_variables()
    return [source_hash(), str(root), sys.version, sys.platform, platform.machine(),
            {module: _version(module, dist) for module, dist in LIBRARIES.items()},
            [str(torch.get_default_dtype()), str(torch.get_default_device()), torch.is_grad_enabled(),
             torch.are_deterministic_algorithms_enabled()],
            sorted([k, v] for k, v in os.environ.items()
                   if k.startswith(ENVIRONMENT_PREFIXES) and not k.startswith("TORCHINDUCTOR_"))]


def _refuse_active_context_variables() -> None:
    """attnres' context variables (a parity check's routing or rounding records) change what a forward computes;
    each is None outside its context."""
    for name, module in list(sys.modules.items()):
        if name.startswith("attnres_export."):
            for attribute, value in list(vars(module).items()):
                if isinstance(value, contextvars.ContextVar) and value.get(None) is not None:
                    raise Uncacheable(f"{name}.{attribute} is set")


def _version(module: str, distribution: str) -> str | None:
    """The installed version of ``distribution``; None when ``module`` is not installed at all (nothing traced can
    run it)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        if importlib.util.find_spec(module) is not None:
            raise Uncacheable(f"{module} is importable but has no installed version to key") from None
        return None


def _covered(module: str | None) -> bool:
    top = (module or "").partition(".")[0]
    return top in ("attnres_export", "builtins", *LIBRARIES) or top in sys.stdlib_module_names


_CONTAINERS = (list, tuple, dict, set, frozenset, collections.OrderedDict, collections.defaultdict, torch.Size)


def _ours(kind: type) -> bool:
    return kind.__module__.partition(".")[0] == "attnres_export"


def _is_namedtuple(kind: type) -> bool:
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Describer:
    """Plain JSON data that tells apart any two objects a trace reads differently. A module is its class, weights
    (shape and type, never values), submodules and every other attribute; an object described before is referred
    to by number, so shared and cyclic structure is described too."""

    def __init__(self) -> None:
        self.numbers: dict[int, int] = {}
        self.weights: dict[int, int] = {}
        self.held: list[object] = []
        """Everything numbered, kept alive so that no id is reused while describing."""

    def describe(self, value: object, where: str, depth: int) -> object:
        if depth > _MAX_DEPTH:
            raise Uncacheable(f"{where} is nested more than {_MAX_DEPTH} deep")
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return [kind.__name__, value]
        if kind in (float, complex, bytes):
            return [kind.__name__, repr(value)]
        if isinstance(value, enum.Enum):
            return ["enum", self.name(kind, where), value.name]
        if isinstance(value, (int, float, complex, str, bytes)):  # a subclass: its value, class and attributes
            base = next(t for t in (int, float, complex, str, bytes) if isinstance(value, t))
            return ["value", self.name(kind, where), base.__repr__(value), self._attributes(value, where, depth + 1)]
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return [kind.__name__, str(value)]
        if isinstance(value, np.generic):
            return ["numpy", value.dtype.str, repr(value.item())]
        if id(value) in self.numbers:
            return ["seen", self.numbers[id(value)]]
        self.numbers[id(value)] = len(self.numbers)
        self.held.append(value)
        return self._numbered(value, kind, where, depth + 1)

    def _numbered(self, value: object, kind: type, where: str, depth: int) -> object:
        if isinstance(value, nn.Module):
            return self._module(value, where, depth)
        if isinstance(value, torch.Tensor):
            return self._constant(value, where)
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise Uncacheable(f"{where} is a NumPy array of Python objects")
            return ["ndarray", value.dtype.str, list(value.shape), _hash(np.ascontiguousarray(value).tobytes())]
        if isinstance(value, type):
            return ["class", self.name(value, where)]
        if isinstance(value, types.MethodType):
            return ["method", self.describe(value.__func__, where, depth), self.describe(value.__self__, where, depth)]
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            if getattr(value, "__closure__", None):
                raise Uncacheable(f"{where} is a closure")
            return ["function", self.name(value, where)]
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            if not (kind in _CONTAINERS or _is_namedtuple(kind) or _ours(kind) or dataclasses.is_dataclass(kind)):
                raise Uncacheable(f"{where} is a {kind.__module__}.{kind.__qualname__}, a container the key does "
                                  "not know")
            return self._container(value, kind, where, depth)
        if _ours(kind) or dataclasses.is_dataclass(kind):
            return ["object", self.name(kind, where), self._attributes(value, where, depth)]
        text = repr(value)
        if not _covered(kind.__module__) or " at 0x" in text:
            raise Uncacheable(f"{where} is a {kind.__module__}.{kind.__qualname__}, which the key cannot describe")
        return ["repr", self.name(kind, where), text]

    def _container(self, value, kind: type, where: str, depth: int) -> list:
        if isinstance(value, dict):
            items = [[self.describe(k, where, depth), self.describe(v, f"{where}[{k!r}]", depth)]
                     for k, v in value.items()]
        elif isinstance(value, (set, frozenset)):
            items = sorted(json.dumps(self.describe(v, where, depth)) for v in value)
        else:
            items = [self.describe(v, f"{where}[{i}]", depth) for i, v in enumerate(value)]
        state = self._attributes(value, where, depth)
        if isinstance(value, collections.defaultdict):
            state.append(["default_factory", self.describe(value.default_factory, where, depth)])
        return ["container", self.name(kind, where), items, state]

    def _module(self, module: nn.Module, where: str, depth: int) -> list:
        special = ("_parameters", "_buffers", "_modules")
        return ["module", self.name(type(module), where),
                [[name, self._weight(t, f"{where}.{name}")] for name, t in module._parameters.items()],
                [[name, self._weight(t, f"{where}.{name}")] for name, t in module._buffers.items()],
                [[name, self.describe(m, f"{where}.{name}", depth)] for name, m in module._modules.items()],
                [[name, self.describe(v, f"{where}.{name}", depth)] for name, v in sorted(vars(module).items())
                 if name not in special]]

    def _weight(self, tensor: torch.Tensor | None, where: str) -> list | None:
        """A parameter or buffer: the trace takes an empty tensor of its shape and type in its place."""
        if tensor is None:
            return None
        self.held.append(tensor)
        number = self.weights.setdefault(id(tensor), len(self.weights))
        return ["weight", number, self.name(type(tensor), where), str(tensor.dtype), list(tensor.shape)]

    def _constant(self, tensor: torch.Tensor, where: str) -> list:
        """A tensor that is no weight: the trace bakes its values in."""
        if tensor.is_meta or tensor.layout != torch.strided or tensor.is_quantized:
            raise Uncacheable(f"{where} is a tensor the trace reads whose values are not at hand")
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return ["tensor", self.name(type(tensor), where), str(tensor.dtype), list(tensor.shape),
                list(tensor.stride()), tensor.requires_grad, _hash(data)]

    def _attributes(self, value: object, where: str, depth: int) -> list:
        state = dict(getattr(value, "__dict__", {}))
        for cls in type(value).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                    state[slot] = getattr(value, slot)
        return [[name, self.describe(v, f"{where}.{name}", depth)] for name, v in sorted(state.items())]

    def name(self, obj: object, where: str) -> str:
        """``module.qualname`` of a class or function that this name resolves to (torch's builtins by their plain
        name), in a library the key versions."""
        module, qualname = getattr(obj, "__module__", None) or "", getattr(obj, "__qualname__", "")
        if not _covered(module):
            raise Uncacheable(f"{where}: {module}.{qualname} is from outside the libraries the key versions")
        for path in dict.fromkeys((qualname, getattr(obj, "__name__", ""))):
            found = sys.modules.get(module)
            for part in path.split("."):
                found = getattr(found, part, None)
            if found is obj:
                return f"{module}.{path}"
        raise Uncacheable(f"{where}: {module}.{qualname} is not what that name holds (a local or replaced "
                          "definition)")
