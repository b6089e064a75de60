"""A checkpoint loads without a second copy of its weights: in its stored types when asked, cast only where a
caller needs another type, and the references read such a model in float32 or float64 without copying it."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnres_export.backends.pytorch.runner import TorchRunner, read_as
from attnres_export.errors import CheckpointError
from attnres_export.models import load_checkpoint, save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.checkpoint import model_as
from attnres_export.models.example import make_example
from attnres_export.models.store import files
from tests.conftest import SMALL

KEPT_FLOAT32 = (".query", "_res.norm.weight")
"""Aggregation tensors: never held below float32 (``KeepFloat32``)."""


@pytest.fixture(scope="module", params=["float16", "bfloat16"])
def half_checkpoint(request, tmp_path_factory):
    """A Block AttnRes checkpoint whose every tensor is stored in a half type."""
    cfg = AttnResLMConfig(**SMALL, n_layers=2, block_size=2)
    model = make_example(cfg, seed=5).to(getattr(torch, request.param))
    for tensor in model.state_dict().values():
        tensor.data = tensor.data.to(getattr(torch, request.param))
    path = tmp_path_factory.mktemp("half") / f"{request.param}.pt"
    save_checkpoint(model, cfg, path)
    return path, getattr(torch, request.param)


def test_a_half_checkpoint_loads_in_its_stored_type_with_aggregation_tensors_widened_to_float32(half_checkpoint):
    path, stored = half_checkpoint
    model, _ = load_checkpoint(path, dtype=None)
    state = model.state_dict()
    for name, tensor in state.items():
        assert tensor.dtype == (torch.float32 if name.endswith(KEPT_FLOAT32) else stored), name
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    default, _ = load_checkpoint(path)
    assert {t.dtype for t in default.state_dict().values()} == {torch.float32}
    for name, tensor in state.items():
        assert torch.equal(tensor.float(), default.state_dict()[name])


def test_model_as_its_own_type_is_the_model_and_another_type_shares_what_it_can(half_checkpoint):
    path, stored = half_checkpoint
    model, _ = load_checkpoint(path, dtype=None)
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[stored]
    assert model_as(model, name) is model
    as_float32 = model_as(model, "float32")
    assert as_float32 is not model
    mine, theirs = model.state_dict(), as_float32.state_dict()
    for key, tensor in theirs.items():
        assert tensor.dtype == torch.float32
        if key.endswith(KEPT_FLOAT32):
            assert tensor.data_ptr() == mine[key].data_ptr(), key


@pytest.mark.parametrize("compute", ["float32", "float64"])
def test_torch_runner_reads_a_half_model_in_the_compute_type_exactly_as_a_cast_copy_would(half_checkpoint, compute):
    path, _ = half_checkpoint
    model, _ = load_checkpoint(path, dtype=None)
    before = {name: (id(t), t.dtype) for name, t in model.named_parameters()}
    feeds = model.random_inputs(2, 7, np.random.default_rng(0))
    got = TorchRunner(model, list(model.output_names), dtype=compute).infer(feeds)
    copied = copy.deepcopy(model).to(getattr(torch, compute))
    want = TorchRunner(copied, list(model.output_names), dtype=compute).infer(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert got["logits"].dtype == np.dtype(compute)
    assert {name: (id(t), t.dtype) for name, t in model.named_parameters()} == before


def test_read_as_restores_the_module_when_the_forward_fails():
    layer = torch.nn.Linear(3, 2).half()
    weight = layer.weight
    with pytest.raises(RuntimeError, match="boom"), read_as(layer, torch.float64):
        assert layer.weight.dtype == torch.float64
        raise RuntimeError("boom")
    assert layer.weight is weight and type(layer) is torch.nn.Linear


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process's mappings from /proc")
def test_a_float32_checkpoint_loads_memory_mapped_and_used_in_place(tmp_path):
    cfg = AttnResLMConfig(**SMALL, n_layers=1)
    save_checkpoint(make_example(cfg, seed=1), cfg, tmp_path / "m.pt")
    model, _ = load_checkpoint(tmp_path / "m.pt", dtype=None)
    mapped = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(tmp_path / "m.pt")):
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            mapped.append(range(start, end))
    pointer = model.embed.weight.data_ptr()
    assert any(pointer in span for span in mapped), "the weights were copied out of the file"


def test_a_float32_checkpoint_loads_cast_to_float16_group_by_group_with_the_same_values(tmp_path, monkeypatch):
    cfg = AttnResLMConfig(**SMALL, n_layers=2, block_size=2)
    original = make_example(cfg, seed=2)
    save_checkpoint(original, cfg, tmp_path / "m.pt")
    reads = []
    real_load = torch.load

    def counting_load(*args, **kwargs):
        reads.append(kwargs.get("mmap"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(files, "MAPPED_BYTES", 4096)
    monkeypatch.setattr(torch, "load", counting_load)
    model, _ = load_checkpoint(tmp_path / "m.pt", dtype="float16")
    state = original.state_dict()
    assert len(reads) > 3 and all(reads)
    for key, tensor in model.state_dict().items():
        want = state[key] if key.endswith(KEPT_FLOAT32) else state[key].half()
        assert tensor.dtype == want.dtype and torch.equal(tensor, want), key


def test_a_checkpoint_that_changes_between_its_reads_is_refused(tmp_path, monkeypatch):
    cfg = AttnResLMConfig(**SMALL, n_layers=1)
    save_checkpoint(make_example(cfg, seed=2), cfg, tmp_path / "m.pt")
    real_load = torch.load

    def swapped(*args, **kwargs):
        payload = real_load(*args, **kwargs)
        if len(calls) > 0:
            payload["state_dict"] = {k: v.double() for k, v in payload["state_dict"].items()}
        calls.append(1)
        return payload

    calls: list[int] = []
    monkeypatch.setattr(files, "MAPPED_BYTES", 4096)  # the file is mapped again after its first 4 kB
    monkeypatch.setattr(torch, "load", swapped)
    with pytest.raises(CheckpointError, match="changed while it was being read"):
        load_checkpoint(tmp_path / "m.pt", dtype="float16")



ISLANDS = {
    "deepseek_v3": ("gate.e_score_correction_bias",),
    "kimi_k3": ("self_attn.A_log", "self_attn.dt_bias", "self_attn.q_conv1d.weight", "self_attn.k_conv1d.weight",
                "self_attn.v_conv1d.weight", "gate.e_score_correction_bias"),
}
"""Per example folder, the tensors (name suffixes) that stay float32 in every model dtype: transformers keeps them
so (``_keep_in_fp32_modules_strict`` of DeepSeek-V3 and of Glm5Next's KDA), vLLM and SGLang create them float32."""


@pytest.fixture(scope="module")
def island_folders(tmp_path_factory):
    """Example folders of both families, every island tensor random (float32 values no half type holds)."""
    from attnres_export.models.decoder.example import write_example_folder as decoder_folder
    from attnres_export.models.kimi.example import write_example_folder as kimi_folder

    root = tmp_path_factory.mktemp("islands")
    return {"deepseek_v3": decoder_folder("deepseek_v3", root / "deepseek_v3", seed=3)[0],
            "kimi_k3": kimi_folder("kimi_k3", root / "kimi_k3", seed=3, layers=2)[0]}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", sorted(ISLANDS))
def test_router_bias_and_kda_decay_parameters_stay_unrounded_float32_in_half_models(island_folders, family, dtype):
    reference, _ = load_checkpoint(island_folders[family], dtype="float32")
    state = reference.state_dict()
    kept = [name for name in state if name.endswith(ISLANDS[family])]
    assert kept
    for name in kept:
        assert not torch.equal(state[name], state[name].to(getattr(torch, dtype)).float()), f"{name} is degenerate"
    loaded, _ = load_checkpoint(island_folders[family], dtype=dtype)
    for model in (loaded, model_as(reference, dtype), copy.deepcopy(reference).to(getattr(torch, dtype))):
        held = model.state_dict()
        for name in kept:
            assert held[name].dtype == torch.float32 and torch.equal(held[name], state[name]), name
        assert held[ROUTER_WEIGHT[family]].dtype == getattr(torch, dtype)


ROUTER_WEIGHT = {"deepseek_v3": "model.layers.1.mlp.gate.weight", "kimi_k3": "model.layers.1.mlp.gate.weight"}
"""The router's own weight is held in the model dtype (transformers upcasts it when it computes)."""
