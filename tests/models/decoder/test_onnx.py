"""Both forms go through the project's ONNX exporter and run on ONNX Runtime (attnres nodes on their NumPy
reference ops) like the eager model: the plain form at a single token and a longer batch, the with-past form for
a left-padded prefill with an empty cache and then a decode step on the presents; a grouped-query body and a
latent-attention body, unfused and with fused norms, one attnres node per aggregation. Slow: each case is a full
ONNX export."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import onnx_ir as ir
import pytest
import torch

from attnres_export.dims import DimRange
from attnres_export.exporter.to_onnx import export_module
from attnres_export.exporter.with_past import export_with_past, with_past_ranges
from attnres_export.models.base import empty_past, step_input_axes
from attnres_export.models.decoder import from_hf_folder
from tests.models.decoder.hf_bodies import hf_model, k3_site_weights, left_padded, write_folder

CASES = [("llama", False), ("deepseek_v3", True)]


def _k3_model(family: str, path):
    reference = hf_model(family, seed=51, num_hidden_layers=2)
    return from_hf_folder(write_folder(reference, path, attn_res=k3_site_weights(reference, seed=51),
                                       attn_res_block_size=1))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "fuse_norm"), CASES)
@torch.inference_mode()
def test_plain_onnx_matches_the_eager_model(family, fuse_norm, tmp_path):
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner

    model = _k3_model(family, tmp_path / family)
    ids = torch.randint(0, 61, (2, 5))
    dims = {"input_ids": {0: ("batch", DimRange(1, 2, 4)), 1: ("seq", DimRange(1, 5, 32))}}
    with model.score_weights_folded(), model.norms_fused() if fuse_norm else nullcontext():
        proto = ir.serde.serialize_model(export_module(model, {"input_ids": ids}, dims, ["logits"], 18))
    assert sum(node.domain == "attnres" for node in proto.graph.node) == model.fused_node_count() == 4
    with OnnxRuntimeRunner(proto) as runner:
        for shape in ((1, 1), (3, 11)):
            other = torch.randint(0, 61, shape, generator=torch.Generator().manual_seed(53))
            np.testing.assert_allclose(runner.infer({"input_ids": other.numpy()})["logits"], model(other).numpy(),
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "fuse_norm"), CASES)
@torch.inference_mode()
def test_with_past_onnx_prefill_and_decode_match_the_eager_model(family, fuse_norm, tmp_path):
    from attnres_export.backends.onnxruntime.runner import OnnxRuntimeRunner

    model = _k3_model(family, tmp_path / family)
    ranges = with_past_ranges(DimRange(1, 2, 4), DimRange(1, 4, 16), DimRange(0, 4, 32), 64)
    onnx_model, step = export_with_past(model, ranges, "float32", 18, seed=0, fuse_norm=fuse_norm)
    proto = ir.serde.serialize_model(onnx_model)
    assert sum(node.domain == "attnres" for node in proto.graph.node) == model.fused_node_count() == 4
    cache = step.cache_inputs()
    names = list(step_input_axes(cache))
    ids, mask, positions = left_padded(torch.randint(1, 61, (3, 7), generator=torch.Generator().manual_seed(52)),
                                       [0, 2, 5])
    past = empty_past(cache, 3)
    with OnnxRuntimeRunner(proto) as runner:
        got = runner.infer(dict(zip(names, [t.numpy() for t in (ids, mask, positions, *past)], strict=True)))
        want = step(ids, mask, positions, past)
        valid = mask.bool().numpy()
        np.testing.assert_allclose(got["logits"][valid], want[0].numpy()[valid], rtol=1e-4, atol=1e-5)
        token = want[0][:, -1:].argmax(-1)
        mask, positions = torch.cat([mask, torch.ones_like(token)], dim=1), positions[:, -1:] + 1
        presents = [got[c.present] for c in cache]
        got = runner.infer(dict(zip(names, [t.numpy() for t in (token, mask, positions)] + presents, strict=True)))
        want = step(token, mask, positions, list(want[1:]))
    np.testing.assert_allclose(got["logits"], want[0].numpy(), rtol=1e-4, atol=1e-5)
    for c, tensor in zip(cache, want[1:], strict=True):
        np.testing.assert_allclose(got[c.present], tensor.numpy(), rtol=1e-4, atol=1e-5)
