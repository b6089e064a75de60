"""The KV-cache path (docs/decode.md): eager with-past steps equal the full forward; the with-past ONNX serves
prefill (past length 0) and decode for every target and dtype, its metadata gives TensorRT profiles that cover
the past range, and bad options are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from attnres_export.backends.tensorrt.profiles import derive_profile
from attnres_export.dims import DimRange
from attnres_export.exporter.checkpoint import export_checkpoint
from attnres_export.exporter.options import ExportOptions
from attnres_export.graphs.metadata import EXPORT_KEY
from attnres_export.models import load_checkpoint
from attnres_export.models.attnres_lm import AttnResLMWithPast
from attnres_export.parity.feeds import past_feed_maker
from tests.cli.test_cli import assert_one_line_error, invoke
from tests.conftest import slow_after, write_checkpoint

RANGES = {"batch": DimRange(1, 2, 3), "seq": DimRange(1, 1, 12), "past": DimRange(0, 6, 20)}


def _model(tmp_path, **overrides):
    model, _ = load_checkpoint(write_checkpoint(tmp_path / "m.pt", seed=3, n_layers=2, block_size=2, **overrides))
    return model


@pytest.mark.parametrize("residual", slow_after(["attnres", "standard"]))
def test_prefill_then_token_by_token_decode_equals_the_full_forward(tmp_path, residual):
    model = _model(tmp_path, residual=residual)
    wrapper = AttnResLMWithPast(model)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 97, size=(2, 9)))
    with torch.inference_mode():
        full = model(ids)
        out = wrapper(ids[:, :5], torch.ones(2, 5, dtype=torch.long), torch.arange(5).expand(2, 5),
                      wrapper.empty_past(2))
        torch.testing.assert_close(out[0], full[:, :5], rtol=1e-5, atol=1e-5)
        past = list(out[1:])
        for i in range(5, 9):
            out = wrapper(ids[:, i:i + 1], torch.ones(2, i + 1, dtype=torch.long), torch.full((2, 1), i), past)
            past = list(out[1:])
            torch.testing.assert_close(out[0][:, 0], full[:, i], rtol=1e-5, atol=1e-5)
    assert past[0].shape == (2, 4, 9, 8)


def test_left_padding_with_shifted_position_ids_gives_the_unpadded_logits(tmp_path):
    """Rotary angles follow position_ids and padded keys are masked: a left-padded row equals the same tokens
    run alone."""
    model = _model(tmp_path)
    wrapper = AttnResLMWithPast(model)
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 97, size=(1, 4)))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    positions = torch.tensor([[0, 0, 0, 0, 1, 2, 3]])
    with torch.inference_mode():
        alone = model(ids)
        out = wrapper(padded, mask, positions, wrapper.empty_past(1))
        assert torch.isfinite(out[0]).all()
        torch.testing.assert_close(out[0][:, 3:], alone, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("with_past")
    ckpt = write_checkpoint(tmp / "m.pt", seed=3, n_layers=2, block_size=2)
    opts = ExportOptions(ckpt, output=tmp / "m.onnx", batch=RANGES["batch"], seq=RANGES["seq"],
                         past=RANGES["past"], with_past=True)
    return ckpt, export_checkpoint(opts)


@pytest.mark.slow
def test_with_past_export_passes_prefill_and_decode_parity_and_records_dims(exported):
    _, result = exported
    assert result.report.ok and result.fused_nodes == 5
    assert [c.shape for c in result.report.checks] == [[2, 8, 0], [3, 1, 6]]
    model = onnx.load(str(result.path))
    names = [v.name for v in model.graph.input]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert names[3:] == [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert [v.name for v in model.graph.output] == ["logits"] + [f"present.{i}.{kv}" for i in range(2)
                                                                  for kv in ("key", "value")]
    meta = json.loads({p.key: p.value for p in model.metadata_props}[EXPORT_KEY])
    assert meta["dims"]["past"] == [0, 6, 20] and meta["with_past"]
    profile = derive_profile(model)
    past = next(i for i in profile.inputs if i.name == "past_key_values.0.key")
    assert (past.min, past.opt, past.max) == ((1, 4, 0, 8), (2, 4, 6, 8), (3, 4, 20, 8))
    mask = next(i for i in profile.inputs if i.name == "attention_mask")
    assert (mask.min[1], mask.max[1]) == (1, 32)


@pytest.mark.slow
@pytest.mark.parametrize("past_len", [0, 1, 2, 17])
def test_with_past_onnx_matches_pytorch_at_every_past_length_including_zero(exported, past_len):
    """Sizes 0 and 1 are the ones torch.export specialises: the graph traced at past >= 2 must serve them."""
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner

    ckpt, result = exported
    model, _ = load_checkpoint(ckpt)
    reference = AttnResLMWithPast(model)
    feeds = past_feed_maker(reference, "float32", seed=5)((2, 3, past_len))
    with OnnxRuntimeRunner(result.path) as runner:
        got = runner.infer(feeds)
    with torch.inference_mode():
        want = reference(*(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "position_ids")),
                         [torch.from_numpy(feeds[n]) for n in reference.past_names()])
    np.testing.assert_allclose(got["logits"], want[0].numpy(), rtol=1e-4, atol=1e-5)
    assert got["present.1.value"].shape == (2, 4, past_len + 3, 8)


@pytest.mark.slow
@pytest.mark.parametrize(("target", "dtype"), [("portable", "float32"), ("tensorrt", "float16"),
                                               ("portable", "bfloat16"), ("tensorrt", "bfloat16"),
                                               ("portable", "float16")])
def test_with_past_export_passes_parity_for_every_target_and_dtype(tmp_path, target, dtype):
    ckpt = write_checkpoint(tmp_path / "m.pt", seed=4, n_layers=2, block_size=0)
    opts = ExportOptions(ckpt, output=tmp_path / "m.onnx", target=target, dtype=dtype, batch=RANGES["batch"],
                         seq=RANGES["seq"], past=RANGES["past"], with_past=True)
    result = export_checkpoint(opts)
    assert result.report.ok, result.report.to_dict()
    assert [c.shape[2] for c in result.report.checks] == [0, 6]


@pytest.mark.slow
def test_with_past_onnx_converts_to_ort_trt_and_back(exported, tmp_path):
    _, result = exported
    out, back = tmp_path / "o.onnx", tmp_path / "b.onnx"
    assert invoke("convert", result.path, "--target", "ort-trt", "-o", out).exit_code == 0
    assert invoke("convert", out, "--target", "portable", "-o", back).exit_code == 0
    assert [v.name for v in onnx.load(str(back)).graph.input] == [v.name for v in onnx.load(str(result.path))
                                                                  .graph.input]


@pytest.mark.parametrize(("args", "message"), slow_after([
    (["--past", "0:8:64"], "--past max 64 plus --seq min 1 exceeds the model's max_seq_len 64"),
    (["--past", "0:1:4", "--seq", "1:1:65"], "--seq max 65 exceeds"),
], fast=2))
def test_bad_with_past_options_are_refused_in_one_line(tmp_path, args, message):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    result = invoke("export", ckpt, "--with-past", "-o", tmp_path / "o.onnx", *args)
    assert_one_line_error(result, message)
    assert not (tmp_path / "o.onnx").exists()


def test_past_without_with_past_is_refused(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m.pt", n_layers=1)
    assert_one_line_error(invoke("export", ckpt, "--past", "0:1:4", "-o", tmp_path / "o.onnx"),
                          "--past needs --with-past")
