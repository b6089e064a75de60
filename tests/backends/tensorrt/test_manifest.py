"""ENGINE.json: written atomically beside the engine, read back unchanged, malformed ones refused."""

from __future__ import annotations

import hashlib
import json

import pytest

from attnres_export.backends.tensorrt.manifest import (
    EngineManifest,
    manifest_path,
    read_manifest,
    sha256_file,
    write_manifest,
)
from attnres_export.errors import EngineError


def manifest(library: str | None = "/libs/libattnres_trt.so", embedded: bool = False) -> EngineManifest:
    return EngineManifest(
        onnx="m.onnx", dtype="float16", op_set_version=1, tensorrt_version="10.8.0", cuda_version="12.8",
        gpu="NVIDIA H200", profiles=[{"input_ids": {"min": [1, 1], "opt": [2, 16], "max": [8, 64]}}],
        dims={"batch": [1, 2, 8], "seq": [1, 16, 64]}, input_axes={"input_ids": ["batch", "seq"]},
        plugin_library=library, plugin_sha256="ab" * 32, plugin_embedded=embedded,
        plugin_nodes=["agg0"], inlined_nodes=[],
    )


def test_manifest_round_trips_beside_the_engine(tmp_path):
    engine = tmp_path / "m.engine"
    written = write_manifest(engine, manifest())
    assert written == manifest_path(engine) == tmp_path / "m.engine.json"
    assert read_manifest(engine) == manifest()
    assert json.loads(written.read_text())["format"] == "attnres-engine-manifest"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.engine.json"]


def test_sha256_matches_hashlib(tmp_path):
    library = tmp_path / "libattnres_trt.so"
    library.write_bytes(b"\x7fELF" + bytes(range(256)) * 5000)
    assert sha256_file(library) == hashlib.sha256(library.read_bytes()).hexdigest()


def test_missing_manifest_reads_as_none(tmp_path):
    assert read_manifest(tmp_path / "x.engine") is None


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", "unreadable engine manifest"),
    (json.dumps({"format": "other"}), "not an attnres engine manifest"),
    (json.dumps({"format": "attnres-engine-manifest", "version": 99}), "version 99"),
    (json.dumps({"format": "attnres-engine-manifest", "version": 1, "dtype": "float32"}), "incomplete"),
])
def test_malformed_manifest_is_refused_with_one_line(tmp_path, text, match):
    (tmp_path / "x.engine.json").write_text(text)
    with pytest.raises(EngineError, match=match):
        read_manifest(tmp_path / "x.engine")
