"""``attnres triton-repo``: one model folder of a Triton model repository, for a stock Triton server.

- a TensorRT engine becomes a ``tensorrt_plan`` model (``1/model.plan``) with one instance group per
  optimization profile; its plugin library is copied to ``plugins/`` in the model folder and loaded through the
  TensorRT backend's ``plugins`` option, unless it is embedded in a version-compatible engine;
- a ``portable`` ONNX (standard ops only) becomes an ``onnxruntime`` model (``1/model.onnx``). A ``tensorrt``
  target ONNX is refused: a stock ONNX Runtime has no attnres ops; an onnxruntime-genai folder's graph too
  (contrib.py).

Every ``config.pbtxt`` is parsed back into Triton's own ``ModelConfig`` message (tritonclient's
``model_config_pb2``) and checked before anything is written; the model folder is built beside the repository
and renamed into place, so a failed or interrupted run leaves the repository as it was.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from attnres_export.atomic import temporary_dir_beside
from attnres_export.serve.contrib import refuse_length_only_attention
from attnres_export.serve.dependencies import ServeError, model_config_pb2
from attnres_export.serve.signature import Signature, TensorSpec, engine_signature, is_engine, onnx_signature

CUSTOM_DOMAINS = ("attnres", "trt.plugins")


@dataclass
class RepoOptions:
    artifact: Path
    repository: Path
    model_name: str | None = None
    instances: int = 1
    max_batch: int | None = None
    max_queue_delay_us: int = 2000
    gpus: list[int] = field(default_factory=list)
    kind: str = "auto"
    cuda_graphs: bool = False
    plugin: Path | None = None
    allow_engine_host_code: bool = False
    overwrite: bool = False


@dataclass
class RepoResult:
    model_dir: Path
    config: str
    backend: str
    plugin: Path | None
    launch: str
    notes: list[str]


def _tensor_block(key: str, specs: tuple[TensorSpec, ...], signature: Signature) -> str:
    entries = []
    for spec in specs:
        dims = ", ".join(str(d) for d in signature.triton_dims(spec))
        entries.append(f'  {{\n    name: "{spec.name}"\n    data_type: {spec.triton_type}\n    dims: [ {dims} ]\n  }}')
    return f"{key} [\n" + ",\n".join(entries) + "\n]\n"


def config_text(name: str, signature: Signature, *, backend: str, instance_groups: list[str],
                max_queue_delay_us: int, cuda_graphs: bool = False) -> str:
    """A ``config.pbtxt`` for Triton (model_config.proto)."""
    platform = 'platform: "tensorrt_plan"\n' if backend == "tensorrt" else 'backend: "onnxruntime"\n'
    parts = [f'name: "{name}"\n', platform, f"max_batch_size: {signature.max_batch}\n",
             _tensor_block("input", signature.inputs, signature), _tensor_block("output", signature.outputs, signature)]
    if signature.batched:
        parts.append(f"dynamic_batching {{\n  max_queue_delay_microseconds: {max_queue_delay_us}\n}}\n")
    parts.append("instance_group [\n" + ",\n".join(instance_groups) + "\n]\n")
    if cuda_graphs:
        parts.append("optimization {\n  cuda {\n    graphs: true\n  }\n}\n")
    return "".join(parts)


def _group(count: int, kind: str, gpus: list[int], profile: int | None = None) -> str:
    lines = [f"    count: {count}", f"    kind: {kind}"]
    if gpus:
        lines.append(f"    gpus: [ {', '.join(str(g) for g in gpus)} ]")
    if profile is not None:
        lines.append(f'    profile: [ "{profile}" ]')
    return "  {\n" + "\n".join(lines) + "\n  }"


def validate_config(text: str, signature: Signature, backend: str) -> object:
    """Parse ``text`` into Triton's ModelConfig and check what the schema alone does not: one line on error."""
    from google.protobuf import text_format

    schema = model_config_pb2()
    config = schema.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ServeError(f"generated config.pbtxt does not parse as Triton's ModelConfig: {exc}") from exc
    problems = []
    if config.max_batch_size < 0:
        problems.append("max_batch_size is negative")
    if backend == "tensorrt" and config.platform != "tensorrt_plan":
        problems.append("a TensorRT model needs platform tensorrt_plan")
    if backend == "onnxruntime" and config.backend != "onnxruntime":
        problems.append("an ONNX model needs backend onnxruntime")
    for tensor in [*config.input, *config.output]:
        if not tensor.name or not tensor.dims or any(d < -1 or d == 0 for d in tensor.dims):
            problems.append(f"tensor {tensor.name!r} has dims {list(tensor.dims)}")
        if tensor.data_type == schema.DataType.TYPE_INVALID:
            problems.append(f"tensor {tensor.name!r} has no data type")
    if [t.name for t in config.input] != [s.name for s in signature.inputs]:
        problems.append("inputs differ from the model's")
    if [t.name for t in config.output] != [s.name for s in signature.outputs]:
        problems.append("outputs differ from the model's")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        problems.append("dynamic batching needs max_batch_size > 0")
    if not config.instance_group or any(g.count < 1 for g in config.instance_group):
        problems.append("every instance group needs count >= 1")
    if problems:
        raise ServeError(f"generated config.pbtxt is not a valid Triton config: {'; '.join(problems)}")
    return config


def _model_name(options: RepoOptions) -> str:
    from attnres_export.serve.server import model_name_for

    return model_name_for(options.artifact, options.model_name)


def _check_options(options: RepoOptions) -> None:
    if options.instances < 1:
        raise ServeError(f"--instances {options.instances}: must be at least 1")
    if options.max_queue_delay_us < 0:
        raise ServeError("--max-queue-delay-us must be >= 0")
    if any(g < 0 for g in options.gpus):
        raise ServeError(f"--gpus {options.gpus}: GPU indices are >= 0")
    if options.kind not in ("auto", "cpu", "gpu"):
        raise ServeError(f"--kind {options.kind!r}: choose auto, cpu or gpu")
    if not Path(options.artifact).is_file():
        raise ServeError(f"{options.artifact}: no such file")
    repo = Path(options.repository)
    if repo.exists() and not repo.is_dir():
        raise ServeError(f"-o {repo} is not a folder; a Triton model repository is a folder")


def _onnx_model(options: RepoOptions, name: str, staging: Path) -> tuple[str, Signature, list[str]]:
    from attnres_export.graphs.external_data import external_locations
    from attnres_export.graphs.load import load_onnx

    model = load_onnx(Path(options.artifact), load_external_data=False)
    refuse_length_only_attention(model, options.artifact)
    custom = sorted({n.domain for n in model.graph.node if n.domain in CUSTOM_DOMAINS})
    if custom:
        count = sum(1 for n in model.graph.node if n.domain in CUSTOM_DOMAINS)
        raise ServeError(f"{Path(options.artifact).name} has {count} node(s) of domain {', '.join(custom)}, which "
                         "Triton's stock onnxruntime backend cannot run; convert it first: `attnres convert "
                         f"{options.artifact} --target portable -o MODEL.portable.onnx`, or build a TensorRT engine")
    if options.cuda_graphs:
        raise ServeError("--cuda-graphs applies to TensorRT engines only")
    signature = onnx_signature(model).with_max_batch(options.max_batch)
    version = staging / "1"
    version.mkdir(parents=True)
    shutil.copyfile(options.artifact, version / "model.onnx")
    folder = Path(options.artifact).parent
    for _, location, _ in external_locations(model):
        target = version / location
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copyfile(folder / location, target)
    kind = "KIND_GPU" if options.kind == "gpu" or (options.kind == "auto" and options.gpus) else "KIND_CPU"
    if kind == "KIND_CPU" and options.gpus:
        raise ServeError("--gpus needs --kind gpu (or auto)")
    groups = [_group(options.instances, kind, [g]) for g in options.gpus] or [_group(options.instances, kind, [])]
    text = config_text(name, signature, backend="onnxruntime", instance_groups=groups,
                       max_queue_delay_us=options.max_queue_delay_us)
    return text, signature, []


def _engine_model(options: RepoOptions, name: str, staging: Path
                  ) -> tuple[str, Signature, list[str], Path | None, bool]:
    from attnres_export.backends.factory import engine_runner

    if options.kind == "cpu":
        raise ServeError("--kind cpu: a TensorRT engine runs on a GPU")
    runner, _ = engine_runner(Path(options.artifact), options.plugin, options.allow_engine_host_code)
    library = runner.plugin_to_load()
    version_compatible = runner.manifest is not None and runner.manifest.version_compatible
    signature = engine_signature(runner).with_max_batch(options.max_batch)
    runner.deactivate()
    version = staging / "1"
    version.mkdir(parents=True)
    shutil.copyfile(options.artifact, version / "model.plan")
    notes = []
    copied = None
    if library is not None:
        plugins = staging / "plugins"
        plugins.mkdir()
        copied = plugins / Path(library).name
        shutil.copyfile(library, copied)
    elif runner.manifest is not None and runner.manifest.plugin_embedded:
        notes.append("the plugin is embedded in this version-compatible engine: start Triton with "
                     "--backend-config=tensorrt,version-compatible=true (runs host code from the engine; only for "
                     "engines you built or trust)")
    if version_compatible and not notes:
        notes.append("this engine is version compatible: start Triton with "
                     "--backend-config=tensorrt,version-compatible=true (runs host code from the engine)")
    profiles = signature.profiles or [{}]
    groups = [_group(options.instances, "KIND_GPU", options.gpus, index) for index in range(len(profiles))]
    text = config_text(name, signature, backend="tensorrt", instance_groups=groups,
                       max_queue_delay_us=options.max_queue_delay_us, cuda_graphs=options.cuda_graphs)
    return text, signature, notes, copied, version_compatible


def write_repository(options: RepoOptions) -> RepoResult:
    """Write ``REPO/NAME`` (config.pbtxt, version 1, plugin library) atomically; returns what was written."""
    _check_options(options)
    name = _model_name(options)
    repo = Path(options.repository)
    target = repo / name
    if target.exists() and not options.overwrite:
        raise ServeError(f"{target} exists; pass --overwrite to replace that model folder, or choose --model-name")
    # A new repository is assembled whole beside REPO; an existing one gets the model folder assembled beside it.
    anchor = target if repo.is_dir() else repo
    with temporary_dir_beside(anchor) as staging:
        staged_repo = staging / "repository"
        model_dir = staged_repo / name
        model_dir.mkdir(parents=True)
        plugin, version_compatible = None, False
        if is_engine(options.artifact):
            text, signature, notes, plugin, version_compatible = _engine_model(options, name, model_dir)
            backend = "tensorrt"
        else:
            text, signature, notes = _onnx_model(options, name, model_dir)
            backend = "onnxruntime"
        validate_config(text, signature, backend)
        (model_dir / "config.pbtxt").write_text(text)
        if anchor is repo:
            os.replace(staged_repo, repo)
        else:
            _replace_dir(model_dir, target, staging)
    final_plugin = target / "plugins" / plugin.name if plugin is not None else None
    launch = f"tritonserver --model-repository={repo.resolve()}"
    if final_plugin is not None:
        launch += f" --backend-config=tensorrt,plugins={final_plugin.resolve()}"
    if version_compatible:
        launch += " --backend-config=tensorrt,version-compatible=true"
    return RepoResult(target, text, backend, final_plugin, launch, notes)


def _replace_dir(new: Path, target: Path, staging: Path) -> None:
    """Rename ``new`` to ``target``; an existing ``target`` is moved into ``staging`` first (removed with it)."""
    if target.exists():
        os.replace(target, staging / ".previous")
    os.replace(new, target)
