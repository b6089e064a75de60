"""Checks before TensorRT parses an ONNX: would every attnres node really become our plugin?

TensorRT's parser silently falls back (to a model-local function) or fails deep inside the build with a
message that names neither the library nor the mismatch. These checks run on a plain listing of the plugin
registry, ``(name, version, namespace)`` tuples, so they are testable without TensorRT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from attnres_export.dtypes import BY_ONNX, ONNX_FLOAT, ONNX_UNDEFINED, STORAGE_TYPES, onnx_type_name
from attnres_export.graphs.tensorrt_quantization import dequantize_problems
from attnres_export.graphs.types import value_types
from attnres_export.ops.descriptors import OPS, is_attnres
from attnres_export.ops.onnx_nodes import attribute

PluginKey = tuple[str, str, str]
"""(plugin name, plugin version, plugin namespace), as TensorRT's registry lists a creator."""

PLUGIN_OVER_FUNCTION = (10, 7)
"""From this TensorRT version a registered plugin wins over a model-local function of the same op."""

OPTIONAL_ABSENT = -1
"""Input type recorded for an optional input left out (empty name)."""


@dataclass(frozen=True)
class NodeRequest:
    """What one ONNX node asks TensorRT's parser for."""

    node: str
    op_type: str
    version: str
    namespace: str
    input_types: tuple[int, ...]

    @property
    def key(self) -> PluginKey:
        return (self.op_type, self.version, self.namespace)

    def describe(self) -> str:
        return f"{self.op_type} version {self.version!r} namespace {self.namespace!r}"


@dataclass(frozen=True)
class Problem:
    """One finding; ``fatal`` ones stop the build."""

    node: str
    message: str
    fatal: bool = True


@dataclass
class PreflightResult:
    requests: list[NodeRequest]
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.fatal for p in self.problems)

    def lines(self) -> list[str]:
        return [f"{'error' if p.fatal else 'warning'}: node {p.node!r}: {p.message}" for p in self.problems]


def node_requests(model: onnx.ModelProto) -> list[NodeRequest]:
    """Every attnres node (either domain) with the plugin it asks for; absent attributes read as the parser
    reads them (version "1", namespace "")."""
    types = value_types(model)
    requests = []
    for index, node in enumerate(model.graph.node):
        if not is_attnres(node):
            continue
        version = _text(attribute(node, "plugin_version", b"1"))
        namespace = _text(attribute(node, "plugin_namespace", b""))
        input_types = tuple(types.get(name, ONNX_UNDEFINED) if name else OPTIONAL_ABSENT
                            for name in node.input)
        requests.append(NodeRequest(node.name or f"#{index}", node.op_type, version, namespace, input_types))
    return requests


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def preflight(
    model: onnx.ModelProto,
    registry: Sequence[PluginKey],
    tensorrt_version: tuple[int, int],
    libraries: Sequence[str] = (),
) -> PreflightResult:
    """Check ``model``'s attnres nodes against ``registry`` as TensorRT ``tensorrt_version`` would parse it, and its
    quantized weights' DequantizeLinear nodes against TensorRT's quantization rules."""
    requests = node_requests(model)
    result = PreflightResult(requests)
    available = {tuple(k) for k in registry}
    functions = {f.name for f in model.functions}  # onnx-tensorrt keys local functions on op_type alone
    for node, request in zip((n for n in model.graph.node if is_attnres(n)), requests, strict=True):
        if request.key not in available:
            result.problems.append(Problem(request.node, _mismatch(request, available, libraries)))
        if node.op_type in functions:
            result.problems.append(_shadowing(request, tensorrt_version))
        result.problems.extend(_dtype_problems(node, request))
    result.problems.extend(Problem(name, f"TensorRT does not build this quantized weight's DequantizeLinear: {problem} "
                                         "(docs/quantization.md#tensorrt)")
                           for name, problem in dequantize_problems(model))
    result.problems.extend(Problem(node.name or node.op_type, f"{node.op_type} is one of ONNX Runtime's own ops (the "
                                   "onnxruntime target), which TensorRT's parser does not build; export with "
                                   "--target tensorrt (docs/onnxruntime-target.md)")
                           for node in model.graph.node if _onnx_runtime_op(node))
    return result


def _onnx_runtime_op(node: onnx.NodeProto) -> bool:
    """A ``com.microsoft`` node, or ONNX Runtime's default-domain ``SimplifiedLayerNormalization``."""
    return node.domain == "com.microsoft" or (node.domain in ("", "ai.onnx")
                                              and node.op_type == "SimplifiedLayerNormalization")


def _mismatch(request: NodeRequest, available: set[PluginKey], libraries: Sequence[str]) -> str:
    same_name = sorted(k for k in available if k[0] == request.op_type)
    loaded = f"libraries loaded: {', '.join(libraries) if libraries else 'none'}"
    op = OPS.get(request.op_type)
    if op is not None and not op.has_plugin and not same_name:
        return (f"{request.op_type} has no TensorRT plugin yet (docs/op-set.md); build the portable form instead: "
                "attnres convert MODEL.onnx --target portable -o MODEL.portable.onnx")
    if not same_name:
        return (f"asks for {request.describe()}, but the registry has no {request.op_type} creator at all "
                f"({loaded}); load libattnres_trt.so (--plugin) before parsing")
    has = "; ".join(f"version {v!r} namespace {ns!r}" for _, v, ns in same_name)
    if any(v == request.version for _, v, _ in same_name):
        what, fix = "namespace", "set plugin_namespace to the registry's (re-export, or rebuild the plugin)"
    elif any(ns == request.namespace for _, _, ns in same_name):
        what, fix = "version", "re-export with this attnres version, or build the plugin from the same release"
    else:
        what, fix = "version and namespace", "re-export and rebuild the plugin from the same attnres release"
    return f"{what} mismatch: asks for {request.describe()}; registry has {request.op_type} {has} ({loaded}); {fix}"


def _shadowing(request: NodeRequest, tensorrt_version: tuple[int, int]) -> Problem:
    version = ".".join(map(str, tensorrt_version))
    if tuple(tensorrt_version) < PLUGIN_OVER_FUNCTION:
        return Problem(request.node, f"a model-local function {request.op_type} shadows the plugin: TensorRT "
                       f"{version} (< 10.7) inlines the function and never uses the plugin; export with "
                       "--target tensorrt (no function bodies)")
    if not request.namespace:
        return Problem(request.node, f"a model-local function {request.op_type} shadows the plugin: the node has "
                       "no plugin_namespace, so TensorRT inlines the function; re-export with --target tensorrt")
    return Problem(request.node, f"a model-local function {request.op_type} is present; TensorRT {version} "
                   "prefers the registered plugin because the node has plugin_namespace", fatal=False)


def _dtype_problems(node: onnx.NodeProto, request: NodeRequest) -> list[Problem]:
    """Input types the plugin's supportsFormatCombination accepts, read from the op's descriptor."""
    op = OPS.get(request.op_type)
    if op is None:
        return [Problem(request.node, f"the attnres op set has no op {request.op_type!r} ({', '.join(OPS)})")]
    if OPTIONAL_ABSENT in request.input_types:
        return [Problem(request.node, "has an empty optional input, which TensorRT's ONNX parser hands the plugin "
                        "as a null tensor; run `attnres convert --target tensorrt` to list only present inputs")]
    problems = [Problem(request.node, p) for p in op.node_problems(node)]
    if problems:
        return problems
    by_name = dict(zip(node.input, request.input_types, strict=True))
    storage, float32 = set(), []
    for position, name in enumerate(op.canonical_inputs(node)):
        if not name:
            continue
        spec = op.spec_of(position)
        if spec.storage:
            storage.add(by_name[name])
        elif by_name[name] != ONNX_FLOAT:
            float32.append(Problem(request.node, f"{spec.name} is {onnx_type_name(by_name[name])}; "
                                                 "the plugin takes float32"))
    names = ", ".join(s.name for s in op.inputs if s.storage)
    unsupported = sorted(onnx_type_name(t) for t in storage if t not in BY_ONNX)
    if unsupported:
        float32.append(Problem(request.node, f"{names} are {', '.join(unsupported)}; the plugin takes "
                                             f"{', '.join(STORAGE_TYPES)}"))
    elif len(storage) > 1:
        float32.append(Problem(request.node, f"{names} have mixed types "
                                             f"({', '.join(sorted(onnx_type_name(t) for t in storage))}); "
                                             "all must be one type"))
    return float32


def registry_listing(trt) -> list[PluginKey]:
    """``(name, version, namespace)`` of every creator in TensorRT's global registry (V1, V3One and V3Quick).

    ``all_creators`` is bound in 10.x and 11.x; ``plugin_creator_list`` lists V2 creators only and is gone in 11.
    """
    return [(c.name, c.plugin_version, c.plugin_namespace) for c in trt.get_plugin_registry().all_creators or []]
