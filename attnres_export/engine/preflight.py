"""Checks before TensorRT parses an ONNX: would every attnres node really become our plugin?

TensorRT's parser silently falls back (to a model-local function) or fails deep inside the build with a
message that names neither the library nor the mismatch. These checks run on a plain listing of the plugin
registry, ``(name, version, namespace)`` tuples, so they are testable without TensorRT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from attnres_export.graphs.onnx_utils import attribute
from attnres_export.graphs.types import value_types
from attnres_export.ops.identity import DOMAIN, ORT_TRT_DOMAIN, RESIDUAL_ATTENTION

PluginKey = tuple[str, str, str]
"""(plugin name, plugin version, plugin namespace), as TensorRT's registry lists a creator."""

PLUGIN_OVER_FUNCTION = (10, 7)
"""From this TensorRT version a registered plugin wins over a model-local function of the same op."""

SOURCE_TYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
"""Types T of the data inputs (sources; q, k, v)."""
FLOAT32 = TensorProto.FLOAT
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
        if node.domain not in (DOMAIN, ORT_TRT_DOMAIN):
            continue
        version = _text(attribute(node, "plugin_version", b"1"))
        namespace = _text(attribute(node, "plugin_namespace", b""))
        input_types = tuple(types.get(name, TensorProto.UNDEFINED) if name else OPTIONAL_ABSENT
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
    """Check ``model``'s attnres nodes against ``registry`` as TensorRT ``tensorrt_version`` would parse it."""
    requests = node_requests(model)
    result = PreflightResult(requests)
    available = {tuple(k) for k in registry}
    functions = {(f.domain, f.name) for f in model.functions}
    for node, request in zip((n for n in model.graph.node if n.domain in (DOMAIN, ORT_TRT_DOMAIN)), requests,
                             strict=True):
        if request.key not in available:
            result.problems.append(Problem(request.node, _mismatch(request, available, libraries)))
        if (node.domain, node.op_type) in functions:
            result.problems.append(_shadowing(request, tensorrt_version))
        result.problems.extend(_dtype_problems(request))
    return result


def _mismatch(request: NodeRequest, available: set[PluginKey], libraries: Sequence[str]) -> str:
    same_name = sorted(k for k in available if k[0] == request.op_type)
    loaded = f"libraries loaded: {', '.join(libraries) if libraries else 'none'}"
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


def _dtype_problems(request: NodeRequest) -> list[Problem]:
    """Input types the plugin's supportsFormatCombination accepts (SPEC 4), per op type."""
    types = request.input_types
    if request.op_type == RESIDUAL_ATTENTION:
        data, float32_inputs = types[:3], {"prev_scores": types[3:4], "mask_bias": types[4:5]}
        min_inputs, data_names = 3, "q, k, v"
    else:
        data, float32_inputs = types[1:], {"score_weight": types[:1]}
        min_inputs, data_names = 2, "sources"
    if len(types) < min_inputs:
        return [Problem(request.node, f"has {len(types)} inputs; {request.op_type} needs at least {min_inputs}")]
    if OPTIONAL_ABSENT in types:
        return [Problem(request.node, "has an empty optional input, which TensorRT's ONNX parser hands the plugin "
                        "as a null tensor; run `attnres convert --target tensorrt` to list only present inputs")]
    problems = [Problem(request.node, f"{name} is {_type_name(found[0])}; the plugin takes float32")
                for name, found in float32_inputs.items() if found and found[0] not in (FLOAT32, OPTIONAL_ABSENT)]
    kinds = set(data)
    unsupported = sorted(_type_name(t) for t in kinds if t not in SOURCE_TYPES)
    if unsupported:
        problems.append(Problem(request.node, f"{data_names} are {', '.join(unsupported)}; the plugin takes "
                                f"{', '.join(SOURCE_TYPES.values())}"))
    elif len(kinds) > 1:
        problems.append(Problem(request.node, f"{data_names} have mixed types "
                                f"({', '.join(sorted(_type_name(t) for t in kinds))}); all must be one type"))
    return problems


def _type_name(elem_type: int) -> str:
    if elem_type == TensorProto.UNDEFINED:
        return "unknown"
    return TensorProto.DataType.Name(elem_type).lower()


def registry_listing(trt) -> list[PluginKey]:
    """``(name, version, namespace)`` of every creator in TensorRT's global registry (V2 and V3 creators)."""
    registry = trt.get_plugin_registry()
    creators = getattr(registry, "all_creators", None) or registry.plugin_creator_list
    return [(c.name, c.plugin_version, c.plugin_namespace) for c in creators]
