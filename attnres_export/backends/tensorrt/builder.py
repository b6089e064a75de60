"""ONNX -> TensorRT engine through the TensorRT Python API, with preflight before parsing and a manifest after.

Networks are strongly typed (TensorRT 10 and 11): an engine's precision is the precision of its ONNX, so there
are no FP16/BF16 builder flags here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from attnres_export.atomic import atomic_write
from attnres_export.backends.tensorrt import plugin_library
from attnres_export.backends.tensorrt.api import logger, require_tensorrt, version_tuple
from attnres_export.backends.tensorrt.manifest import EngineManifest, sha256_file, write_manifest
from attnres_export.backends.tensorrt.verify_embedded import embedding_failure
from attnres_export.dims import DimRange
from attnres_export.errors import EngineError
from attnres_export.graphs.load import load_onnx

if TYPE_CHECKING:
    from attnres_export.backends.tensorrt.preflight import PreflightResult
    from attnres_export.backends.tensorrt.profiles import Profile

PLUGIN_LAYER_TYPES = ("PluginV3", "PluginV2")
"""LayerType prefixes of plugin layers in the engine inspector's JSON (trex knows "PluginV2")."""


@dataclass
class BuildOptions:
    onnx: Path
    output: Path | None = None
    plugin: Path | None = None
    batch: DimRange | None = None
    seq: DimRange | None = None
    past: DimRange | None = None
    """With-past exports: the past length range (the mask's ``total`` follows it, profiles.py)."""
    timing_cache: Path | None = None
    opt_level: int | None = None
    embed_plugin: bool = False
    workspace_mb: int | None = None

    def resolved_output(self) -> Path:
        return self.output or self.onnx.with_suffix(".engine")


@dataclass
class EngineBuild:
    engine: Path
    manifest_path: Path
    manifest: EngineManifest
    preflight: PreflightResult
    notes: list[str] = field(default_factory=list)


class PreflightFailed(EngineError):
    """Preflight found problems; ``result.lines()`` says what each node asks for and what the registry has."""

    def __init__(self, result: PreflightResult) -> None:
        fatal = sum(p.fatal for p in result.problems)
        super().__init__(f"preflight: {fatal} problem(s) would keep attnres nodes from running as the plugin "
                         "(details above); fix them before building")
        self.result = result


def onnx_node_names(model: onnx.ModelProto) -> list[str]:
    from attnres_export.graphs.onnx_utils import attnres_nodes
    from attnres_export.ops.opset import ORT_TRT_DOMAIN

    return [n.name for n in (*attnres_nodes(model.graph), *attnres_nodes(model.graph, ORT_TRT_DOMAIN))]


def classify_layers(engine_info: dict, node_names: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(nodes that run as a plugin layer, nodes that do not, nodes the inspector cannot tell) from its JSON.

    The parser names a layer after its ONNX node; fused layers join names with ``" + "``. A plugin layer has a
    LayerType starting with PluginV3/PluginV2 or a ``PluginType`` key. Myelin may fold nodes into one
    ``{ForeignNode[first...last]}`` layer whose name lists only the ends, so while such a layer exists a node named
    by no other layer is unknown rather than inlined.
    """
    plugin_layers, other_layers, foreign = set(), set(), False
    for layer in engine_info.get("Layers", []):
        if not isinstance(layer, dict):
            continue
        name = str(layer.get("Name", ""))
        if str(layer.get("LayerType", "")).startswith(PLUGIN_LAYER_TYPES) or "PluginType" in layer:
            plugin_layers.update(part.strip() for part in name.split(" + "))
        elif "ForeignNode" in name or layer.get("LayerType") == "Myelin":
            foreign = True
        else:
            other_layers.update(part.strip() for part in name.split(" + "))
    as_plugin = [n for n in node_names if n in plugin_layers]
    rest = [n for n in node_names if n not in plugin_layers]
    if not foreign:
        return as_plugin, rest, []
    return as_plugin, [n for n in rest if n in other_layers], [n for n in rest if n not in other_layers]


def build_engine(opts: BuildOptions, status: Callable[[str], None] = lambda _: None) -> EngineBuild:
    """Preflight, parse, build, inspect, write ENGINE and ENGINE.json; raises EngineError with one line."""
    model = load_onnx(opts.onnx, load_external_data=False)
    from attnres_export.backends.tensorrt.preflight import preflight, registry_listing
    from attnres_export.backends.tensorrt.profiles import derive_profile

    profile = derive_profile(model, {"batch": opts.batch, "seq": opts.seq, "past": opts.past})
    trt = require_tensorrt()
    library = plugin_library.resolve(opts.plugin, dynamic=opts.embed_plugin)
    status(f"loading plugin library {library}")
    plugin_library.load(trt, library)

    check = preflight(model, registry_listing(trt), version_tuple(trt.__version__), [str(library)])
    if not check.ok:
        raise PreflightFailed(check)
    notes = check.lines()

    status(f"parsing {opts.onnx}")
    builder = trt.Builder(logger(trt))
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger(trt))
    if not parser.parse_from_file(str(opts.onnx)):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise EngineError(f"TensorRT could not parse {opts.onnx}: {errors[0] if errors else 'no details'}")

    config = _builder_config(trt, builder, profile, opts, library, notes)
    status("building the engine (this takes a while)")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError("TensorRT could not build the engine; rerun with --debug and read the TensorRT log above")
    out = opts.resolved_output()
    with atomic_write(out) as tmp:
        tmp.write_bytes(memoryview(serialized))
    if opts.timing_cache is not None:
        _save_timing_cache(config, opts.timing_cache, notes)

    embedded = False
    if opts.embed_plugin:
        status("checking the embedded plugin in a fresh process")
        failure = embedding_failure(out)
        embedded = failure is None
        if failure is not None:
            notes.append(f"warning: {out.name} does not carry its plugin ({failure}); the manifest records "
                         f"plugin_embedded false, so runners load {library}")
    layers = _inspect(trt, serialized, opts.embed_plugin)
    if layers is None:
        notes.append("warning: could not inspect the engine's layers; which nodes run as the plugin is unknown")
    node_names = onnx_node_names(model)
    as_plugin, inlined, unknown = classify_layers(layers, node_names) if layers is not None else ([], [], node_names)
    manifest = _manifest(trt, model, opts, profile, library, embedded, (as_plugin, inlined, unknown))
    path = write_manifest(out, manifest)
    return EngineBuild(out, path, manifest, check, notes)


def _network_flags(trt) -> int:
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def _builder_config(trt, builder, profile: Profile, opts: BuildOptions, library: Path, notes: list[str]):
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if opts.workspace_mb is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_mb << 20)
    if opts.opt_level is not None:
        if not 0 <= opts.opt_level <= 5:
            raise EngineError(f"--opt-level {opts.opt_level}: TensorRT takes 0..5 (default 3)")
        config.builder_optimization_level = opts.opt_level
    shapes = builder.create_optimization_profile()
    for item in profile.inputs:
        shapes.set_shape(item.name, item.min, item.opt, item.max)
    config.add_optimization_profile(shapes)
    if opts.timing_cache is not None:
        _attach_timing_cache(config, opts.timing_cache, notes)
    if opts.embed_plugin:
        # TensorRT serializes plugin libraries only into version-compatible engines (setPluginsToSerialize).
        config.plugins_to_serialize = [str(library)]
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    return config


def _attach_timing_cache(config, path: Path, notes: list[str]) -> None:
    """Use the cache at ``path``; one TensorRT refuses (another TensorRT version or GPU) gives way to a fresh one."""
    data = path.read_bytes() if path.is_file() else b""
    if data:
        cache = config.create_timing_cache(data)
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            return
        notes.append(f"warning: TensorRT refused the timing cache {path} (made by another TensorRT version or on "
                     "another GPU); building with a fresh one, which replaces it")
    fresh = config.create_timing_cache(b"")
    if fresh is None or not config.set_timing_cache(fresh, ignore_mismatch=False):
        notes.append(f"warning: TensorRT could not create a timing cache; building without one ({path} is kept)")


def _save_timing_cache(config, path: Path, notes: list[str]) -> None:
    cache = config.get_timing_cache()
    if cache is None:
        notes.append(f"warning: the build used no timing cache, so {path} was not written")
        return
    with atomic_write(path) as tmp:
        tmp.write_bytes(memoryview(cache.serialize()))


def _inspect(trt, serialized, version_compatible: bool) -> dict | None:
    """The engine inspector's JSON, or None when the fresh engine cannot be deserialized in this process.

    A version-compatible engine carries host code (the lean runtime); this process just built it, so it is trusted.
    """
    runtime = trt.Runtime(logger(trt))
    runtime.engine_host_code_allowed = version_compatible
    engine = runtime.deserialize_cuda_engine(serialized)
    if engine is None:
        return None
    inspector = engine.create_engine_inspector()
    return json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def _manifest(trt, model: onnx.ModelProto, opts: BuildOptions, profile: Profile, library: Path, embedded: bool,
              nodes: tuple[list[str], list[str], list[str]]) -> EngineManifest:
    import torch

    from attnres_export.graphs.metadata import export_info, onnx_dtype

    info = export_info(model)
    cuda = torch.cuda.is_available()
    as_plugin, inlined, unknown = nodes
    return EngineManifest(
        onnx=str(opts.onnx), dtype=onnx_dtype(model), op_set_version=info.get("op_set_version"),
        tensorrt_version=trt.__version__, cuda_version=str(torch.version.cuda) if cuda else "unknown",
        gpu=torch.cuda.get_device_name(0) if cuda else "unknown", profiles=[profile.to_dict()],
        dims={k: v.as_list() for k, v in profile.dims.items()}, input_axes=profile.axes,
        plugin_library=str(library.resolve()), plugin_sha256=sha256_file(library),
        plugin_embedded=embedded, version_compatible=opts.embed_plugin, plugin_nodes=as_plugin,
        inlined_nodes=inlined, unknown_nodes=unknown,
    )
