"""The trace cache (``exporter/trace_cache.py``, docs/exporter-notes.md#the-trace-cache): an export that reads its
trace from the cache writes the bytes of the export that traced it, for every kind of piece the assembled export
traces (an MoE's experts under ``torch.cond`` included, plain and with-past); another checkpoint of the architecture
reads the trace and writes what tracing it writes; the key changes with everything the trace reads and with nothing
else; a bad entry is traced again; ``--no-trace-cache`` and ``ATTNRES_TRACE_CACHE=off`` neither read nor write; and
a hit runs no torch.onnx export and imports no onnxscript.

tests/conftest.py switches the cache off for every other test; each test here has a folder of its own."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx_ir as ir
import pytest
import torch
from typer.testing import CliRunner

from attnres_export.cli import app
from attnres_export.dims import DimRange
from attnres_export.exporter import piece_trace, trace_cache
from attnres_export.exporter.assemble import plan_of
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.exporter.piece_trace import cache_key, first_of_each_kind
from attnres_export.exporter.trace_cache import ENVIRONMENT, Uncacheable, read_trace, write_trace
from attnres_export.models.store import open_checkpoint
from tests.conftest import slow_after

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--d-model", "32", "--d-ff", "48", "--vocab", "97", "--max-seq-len", "64", "--block-size", "2"]
RANGES = {"batch": DimRange(1, 2, 4), "seq": DimRange(1, 8, 32)}
SIZES = {"batch": 2, "seq": 8}
runner = CliRunner()


def example(out: Path, arch: str = "attnres-lm", *extra: str) -> Path:
    """``attnres example OUT --arch ARCH --layers 2``: a ``.pt`` for attnres-lm, else a Hugging Face folder."""
    small = SMALL if arch == "attnres-lm" else []
    result = runner.invoke(app, ["example", str(out), "--arch", arch, "--layers", "2", *small, *extra])
    assert result.exit_code == 0, result.output
    return out


def export(source: Path, out: Path, with_past: bool = False) -> tuple[dict[str, bytes], list[str]]:
    """``attnres-export SOURCE -o OUT --seq 1:8:32 [--with-past --past 0:8:31] --no-check``: every file written
    (the model and any data file) and the status lines."""
    statuses: list[str] = []
    export_checkpoint(ExportOptions(source, out, seq=RANGES["seq"], with_past=with_past,
                                    past=DimRange(0, 8, 31) if with_past else None, check=False),
                      status=statuses.append)
    return {path.name: path.read_bytes() for path in sorted(out.parent.iterdir())}, statuses


def traced(statuses: list[str]) -> bool:
    """Did the export trace its pieces (rather than read them from the cache)?"""
    return any(s.startswith("traced ") and " kinds in " in s for s in statuses)


def entries(cache: Path) -> list[Path]:
    return sorted(cache.iterdir()) if cache.is_dir() else []


@dataclasses.dataclass
class Primed:
    """An attnres-lm checkpoint exported once with the cache in ``cache``: the files written, and the entry."""

    source: Path
    cache: Path
    files: dict[str, bytes]
    entry: Path

    def copy_to(self, tmp_path: Path, monkeypatch) -> Path:
        """A copy of the primed cache in ``tmp_path``, chosen by ``ATTNRES_TRACE_CACHE``."""
        cache = tmp_path / "traces"
        shutil.copytree(self.cache, cache)
        monkeypatch.setenv(ENVIRONMENT, str(cache))
        return cache


@pytest.fixture(scope="module")
def primed(tmp_path_factory) -> Primed:
    root = tmp_path_factory.mktemp("trace_cache")
    source, cache = example(root / "a.pt"), root / "traces"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENVIRONMENT, str(cache))
        files, statuses = export(source, root / "cold" / "m.onnx")
    assert traced(statuses), statuses
    [entry] = entries(cache)
    return Primed(source, cache, files, entry)


def test_an_attnres_lm_export_from_the_cache_writes_the_bytes_of_the_export_that_traced(primed, tmp_path,
                                                                                        monkeypatch):
    cache = primed.copy_to(tmp_path, monkeypatch)
    files, statuses = export(primed.source, tmp_path / "warm" / "m.onnx")
    assert f"traced pieces: from cache {cache / primed.entry.name}" in statuses and not traced(statuses)
    assert files == primed.files


@pytest.mark.parametrize(("arch", "with_past"), slow_after([
    ("qwen3-moe", False), ("llama", False), ("attnres-lm", True), ("deepseek-v3", True)]))
def test_an_export_from_the_cache_writes_the_bytes_of_the_export_that_traced(tmp_path, monkeypatch, arch, with_past):
    """A Hugging Face folder, an MoE body (its experts traced as torch.cond: If and Loop subgraphs), and with-past
    graphs (DeepSeek-V3: latent attention and MoE)."""
    source = example(tmp_path / "model", arch)
    monkeypatch.setenv(ENVIRONMENT, str(tmp_path / "traces"))
    cold, cold_statuses = export(source, tmp_path / "cold" / "m.onnx", with_past)
    warm, warm_statuses = export(source, tmp_path / "warm" / "m.onnx", with_past)
    assert traced(cold_statuses) and not traced(warm_statuses), (cold_statuses, warm_statuses)
    assert len(entries(tmp_path / "traces")) == 1
    assert warm == cold


def test_another_checkpoint_of_the_architecture_reads_the_trace_and_writes_what_tracing_it_writes(
        primed, tmp_path, monkeypatch):
    other = example(tmp_path / "b.pt", "attnres-lm", "--seed", "1")
    cache = primed.copy_to(tmp_path, monkeypatch)
    warm, statuses = export(other, tmp_path / "warm" / "m.onnx")
    assert not traced(statuses) and entries(cache) == [cache / primed.entry.name], statuses
    monkeypatch.setenv(ENVIRONMENT, "off")
    fresh, statuses = export(other, tmp_path / "fresh" / "m.onnx")
    assert traced(statuses)
    assert warm == fresh and warm != primed.files


def test_a_checkpoint_with_another_norm_eps_misses_and_stores_a_trace_of_its_own(primed, tmp_path, monkeypatch):
    other = example(tmp_path / "b.pt", "attnres-lm", "--eps", "1e-5")
    cache = primed.copy_to(tmp_path, monkeypatch)
    _, statuses = export(other, tmp_path / "out" / "m.onnx")
    assert traced(statuses), statuses
    assert len(entries(cache)) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "a changed byte", "another key's entry", "a folder"])
def test_a_bad_entry_is_traced_again_and_replaced(primed, tmp_path, monkeypatch, damage):
    cache = primed.copy_to(tmp_path, monkeypatch)
    entry = cache / primed.entry.name
    key, data = entry.stem, entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(b"\xff" * 100)
    elif damage == "truncated":
        entry.write_bytes(data[:len(data) // 2])
    elif damage == "a changed byte":
        middle = len(data) // 2
        entry.write_bytes(data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:])
    elif damage == "another key's entry":
        entry.write_bytes(write_trace(tmp_path / "other", "0" * 64, read_trace(cache, key)).read_bytes())
    else:
        entry.unlink()
        entry.mkdir()
    assert read_trace(cache, key) is None
    files, statuses = export(primed.source, tmp_path / "out" / "m.onnx")
    assert traced(statuses) and files == primed.files, statuses
    if damage == "a folder":
        assert any("not cached: cannot write" in s for s in statuses), statuses
    else:
        assert entry.read_bytes() == data


def _refuse(*_args):
    raise AssertionError("the trace cache was used")


def test_no_trace_cache_on_the_command_line_neither_reads_nor_writes_the_cache(primed, tmp_path, monkeypatch):
    cache = primed.copy_to(tmp_path, monkeypatch)
    monkeypatch.setattr(piece_trace, "read_trace", _refuse)
    monkeypatch.setattr(piece_trace, "write_trace", _refuse)
    out = tmp_path / "out" / "m.onnx"
    result = runner.invoke(app, ["export", str(primed.source), "-o", str(out), "--seq", "1:8:32", "--no-check",
                                 "--no-trace-cache"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == primed.files["m.onnx"]
    assert entries(cache) == [cache / primed.entry.name]


def test_attnres_trace_cache_off_neither_reads_nor_writes_any_cache(primed, tmp_path, monkeypatch):
    monkeypatch.setenv(ENVIRONMENT, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(piece_trace, "read_trace", _refuse)
    monkeypatch.setattr(piece_trace, "write_trace", _refuse)
    files, statuses = export(primed.source, tmp_path / "out" / "m.onnx")
    assert traced(statuses) and files == primed.files
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()


def test_the_cache_folder_is_the_variable_else_the_xdg_cache_else_the_home_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(ENVIRONMENT, str(tmp_path / "mine"))
    assert trace_cache.cache_folder() == tmp_path / "mine"
    assert trace_cache.cache_folder(enabled=False) is None
    monkeypatch.setenv(ENVIRONMENT, "OFF")
    assert trace_cache.cache_folder() is None
    monkeypatch.delenv(ENVIRONMENT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert trace_cache.cache_folder() == tmp_path / "xdg" / "attnres" / "traces"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert trace_cache.cache_folder() == tmp_path / "home" / ".cache" / "attnres" / "traces"


CHILD = """
import json, sys
import attnres_export.cli as cli
sys.argv = ["attnres-export", *json.loads(sys.argv[1])]
try:
    cli.export_main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps([m for m in ("onnxscript", "torch.onnx._internal.exporter._core") if m in sys.modules]))
"""


def test_an_export_from_the_cache_imports_no_onnxscript_and_not_torch_onnxs_exporter(primed, tmp_path,
                                                                                    monkeypatch):
    """torch.onnx's package itself is imported on a hit too: torch._dynamo imports it, and the first meta-device
    op of the model's build imports torch._dynamo (docs/exporter-notes.md#the-trace-cache)."""
    cache = primed.copy_to(tmp_path, monkeypatch)
    out = tmp_path / "m.onnx"
    argv = [str(primed.source), "-o", str(out), "--seq", "1:8:32", "--no-check"]
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "", "HOME": str(tmp_path),
                                                       ENVIRONMENT: str(cache)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert out.read_bytes() == primed.files["m.onnx"]


@pytest.fixture(scope="module")
def pieces(primed):
    """The first piece of each kind of the primed checkpoint's plan, on the meta device as an export holds them."""
    model = open_checkpoint(primed.source).streamed_model("float32").module
    return first_of_each_kind(plan_of(model, with_past=False, fuse_norm=False).pieces())


def key(pieces, ranges=RANGES, sizes=SIZES, dtype="float32", opset=18) -> str:
    return cache_key(pieces, ranges, sizes, dtype, opset)


def test_the_key_changes_with_the_dims_dtype_opset_libraries_and_source(pieces, monkeypatch):
    base = key(pieces)
    assert base == key(pieces)
    assert len({base, key(pieces, ranges={**RANGES, "seq": DimRange(1, 8, 64)}), key(pieces, sizes={**SIZES, "seq": 4}),
                key(pieces, dtype="float16"), key(pieces, opset=19)}) == 5
    monkeypatch.setattr(trace_cache, "source_hash", lambda: "0" * 64)
    changed_source = key(pieces)
    monkeypatch.setattr(trace_cache, "_version", lambda module, distribution: "0.0")
    changed_versions = key(pieces)
    monkeypatch.setenv("TORCH_ONNX_ENABLE_DRAFT_EXPORT", "1")
    assert len({base, changed_source, changed_versions, key(pieces)}) == 4


def test_the_key_changes_with_a_module_attribute_and_not_with_weight_values(pieces, monkeypatch):
    base = key(pieces)
    norm = next(m for p in pieces for m in p.module.modules() if hasattr(m, "eps"))
    monkeypatch.setattr(norm, "eps", norm.eps * 10)
    assert key(pieces) != base
    monkeypatch.undo()
    head = next(p.module for p in pieces if p.kind == "head").lm_head
    monkeypatch.setattr(head, "weight", torch.nn.Parameter(torch.zeros(head.weight.shape)))
    assert key(pieces) == base  # the trace takes an empty stand-in for every weight


def test_the_source_hash_changes_when_a_source_file_changes(tmp_path, monkeypatch):
    copy = tmp_path / "attnres_export"
    shutil.copytree(trace_cache._package_root(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(trace_cache, "_package_root", lambda: copy)
    trace_cache.source_hash.cache_clear()
    try:
        before = trace_cache.source_hash()
        trace_cache.source_hash.cache_clear()
        norm = copy / "models" / "layers" / "norm.py"
        norm.write_text(norm.read_text() + "\n")
        assert trace_cache.source_hash() != before
    finally:
        trace_cache.source_hash.cache_clear()


@pytest.mark.parametrize(("value", "why"), [
    (object(), "builtins.object"),
    (lambda x: x, "<lambda>"),
    (torch.empty(3, device="meta"), "values are not at hand"),
    (dataclasses.make_dataclass("Local", ["x"])(1), "Local"),
])
def test_an_attribute_the_key_cannot_describe_leaves_the_trace_uncached(pieces, monkeypatch, value, why):
    monkeypatch.setattr(pieces[0].module, "extra", value, raising=False)
    with pytest.raises(Uncacheable, match=why):
        key(pieces)


def test_an_active_torch_mode_leaves_the_trace_uncached(pieces):
    with torch.device("cpu"), pytest.raises(Uncacheable, match="mode"):  # a device context is a function mode
        key(pieces)


def test_a_tensor_attribute_that_is_no_weight_is_keyed_by_its_values(pieces, monkeypatch):
    monkeypatch.setattr(pieces[0].module, "table", torch.arange(4.0), raising=False)
    first = key(pieces)
    monkeypatch.setattr(pieces[0].module, "table", torch.arange(4.0) + 1, raising=False)
    assert key(pieces) != first


def test_an_entry_is_an_onnx_model_stamped_with_its_key(tmp_path):
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 18}, name="g"), ir_version=10)
    path = write_trace(tmp_path / "traces", "k" * 64, model)
    assert path == tmp_path / "traces" / f"{'k' * 64}.onnx"
    loaded = read_trace(tmp_path / "traces", "k" * 64)
    assert loaded is not None and loaded.graph.name == "g" and not loaded.metadata_props
    assert (tmp_path / "traces").stat().st_mode & 0o077 == 0


def test_a_write_beyond_the_folders_limit_evicts_the_least_recently_used_entries_and_keeps_the_new_one(tmp_path,
                                                                                                        monkeypatch):
    folder = tmp_path / "traces"
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 18}, name="g"), ir_version=10)
    keys = [str(i) * 64 for i in range(5)]
    for age, name in enumerate(keys[:4]):
        path = write_trace(folder, name, model)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    size = trace_cache.entry_path(folder, keys[0]).stat().st_size
    assert read_trace(folder, keys[0]) is not None  # read now: the most recently used
    monkeypatch.setattr(trace_cache, "KEEP_BYTES", 3 * size)
    write_trace(folder, keys[4], model)
    left = sorted(p.stem for p in folder.glob("*.onnx"))
    assert left == sorted([keys[0], keys[3], keys[4]])


def test_eviction_keeps_the_new_entry_even_when_it_alone_is_over_the_limit(tmp_path):
    folder = tmp_path / "traces"
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 18}, name="g"), ir_version=10)
    old = write_trace(folder, "a" * 64, model)
    new = write_trace(folder, "b" * 64, model)
    os.utime(old, (1_000_000, 1_000_000))
    assert trace_cache.evict(folder, keep=new, keep_bytes=1) == [old]
    assert [p.name for p in folder.iterdir()] == [new.name]
