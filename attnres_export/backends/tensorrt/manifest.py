"""``ENGINE.json`` beside every engine: what it was built with, so a later load can say what is missing.

An engine is opaque and tied to its TensorRT version, GPU and plugin library; without this record a failed
deserialization says nothing about which library or version it wanted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from attnres_export.atomic import write_text_atomic
from attnres_export.errors import EngineError

FORMAT = "attnres-engine-manifest"
VERSION = 1


@dataclass
class EngineManifest:
    """The build record of one engine (paths as given at build time).

    ``plugin_embedded`` is true only when a fresh process without the library deserialized the engine;
    ``version_compatible`` engines carry TensorRT's lean runtime, which runs only with engine host code allowed.
    ``unknown_nodes`` are nodes the engine inspector cannot place (folded into a Myelin ForeignNode layer).
    A runner loads ``plugin_library`` only if its sha256 is still ``plugin_sha256``: the manifest is a sidecar
    anyone can edit, so it names what the engine was built with, never what to trust.
    """

    onnx: str
    dtype: str
    op_set_version: int | None
    tensorrt_version: str
    cuda_version: str
    gpu: str
    profiles: list[dict]
    dims: dict[str, list[int]]
    input_axes: dict[str, list[str | int]]
    plugin_library: str | None
    plugin_sha256: str | None
    plugin_embedded: bool
    version_compatible: bool = False
    plugin_nodes: list[str] = field(default_factory=list)
    inlined_nodes: list[str] = field(default_factory=list)
    unknown_nodes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}


def manifest_path(engine: Path) -> Path:
    """``model.engine`` -> ``model.engine.json``."""
    engine = Path(engine)
    return engine.with_name(engine.name + ".json")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(engine: Path, manifest: EngineManifest) -> Path:
    """Write the manifest beside ``engine`` atomically; returns its path."""
    path = manifest_path(engine)
    write_text_atomic(path, json.dumps(manifest.to_dict(), indent=2) + "\n")
    return path


def read_manifest(engine: Path) -> EngineManifest | None:
    """The manifest beside ``engine``, or None when there is none; a malformed one is an error."""
    path = manifest_path(engine)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"{path}: unreadable engine manifest ({exc}); rebuild the engine") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise EngineError(f"{path}: not an attnres engine manifest; rebuild the engine with `attnres build`")
    if data.get("version") != VERSION:
        raise EngineError(f"{path}: manifest version {data.get('version')!r} is not supported (reads {VERSION})")
    names = {f.name for f in fields(EngineManifest)}
    try:
        return EngineManifest(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise EngineError(f"{path}: incomplete engine manifest ({exc}); rebuild the engine") from exc
