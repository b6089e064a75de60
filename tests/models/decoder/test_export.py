"""Both forms of DecoderLM trace with ``torch.export`` under dynamic batch, sequence and past lengths, as the exporter
traces them, and the traced programs compute what the eager model computes at other shapes than the traced one
(a single token, a prefill with an empty past). With AttnRes the graph holds one ``attnres::aggregate`` per
aggregation (``attnres::aggregate_norm`` with fused norms); without, none."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from attnres_export.models.decoder import from_hf_folder
from attnres_export.ops.aggregate import attnres_aggregate
from attnres_export.ops.aggregate_norm import attnres_aggregate_norm
from tests.conftest import slow_after
from tests.models.decoder.hf_bodies import empty_past, hf_model, k3_site_weights, left_padded, write_folder

MAX = 64


@pytest.fixture(params=slow_after(["llama", "deepseek_v3"]))
def k3_model(request, tmp_path):
    reference = hf_model(request.param, seed=11, num_hidden_layers=2)
    folder = write_folder(reference, tmp_path / request.param, attn_res=k3_site_weights(reference, seed=11),
                          attn_res_block_size=2)
    return from_hf_folder(folder)


def _count(program: torch.export.ExportedProgram, op) -> int:
    return sum(1 for node in program.graph.nodes if node.target == op._opoverload)


@pytest.mark.slow
@torch.inference_mode()
def test_plain_form_exports_with_dynamic_batch_and_sequence(k3_model):
    ids = torch.randint(0, k3_model.config.vocab_size, (2, 5))
    dims = {"input_ids": {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=MAX)}}
    layers = k3_model.config.num_hidden_layers
    with k3_model.score_weights_folded():
        program = torch.export.export(k3_model, (ids,), dynamic_shapes=dims)
        assert _count(program, attnres_aggregate) == k3_model.aggregation_count() == 2 * layers
        with k3_model.norms_fused():
            assert _count(torch.export.export(k3_model, (ids,), dynamic_shapes=dims), attnres_aggregate_norm) == \
                2 * layers
    for shape in ((1, 1), (3, 9)):
        other = torch.randint(0, k3_model.config.vocab_size, shape)
        torch.testing.assert_close(program.module()(other), k3_model(other), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@torch.inference_mode()
def test_with_past_form_exports_with_dynamic_past_and_runs_prefill_and_decode(k3_model):
    step = k3_model.with_past()
    cache = step.cache_inputs()
    b, t, p = 2, 3, 4
    ids = torch.randint(0, k3_model.config.vocab_size, (b, t))
    past = [torch.randn([b if a == "batch" else p if a == "past" else a for a in c.axes]) for c in cache]
    batch, seq, past_len = Dim("batch", min=1, max=8), Dim("seq", min=1, max=MAX), Dim("past", min=0, max=MAX)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: Dim("total", min=1, max=2 * MAX)},
            "position_ids": {0: batch, 1: seq},
            "past": [{c.axes.index("batch"): batch, c.axes.index("past"): past_len} for c in cache]}
    mask, positions = torch.ones(b, p + t, dtype=torch.int64), torch.arange(p, p + t)[None].expand(b, t)
    program = torch.export.export(step, (ids, mask, positions, past), dynamic_shapes=dims).module()

    prompt, mask, positions = left_padded(torch.randint(1, k3_model.config.vocab_size, (3, 7)), [0, 2, 5])
    outputs = [program(prompt, mask, positions, empty_past(k3_model, 3)),
               step(prompt, mask, positions, empty_past(k3_model, 3))]
    valid = mask.bool()
    torch.testing.assert_close(outputs[0][0][valid], outputs[1][0][valid], rtol=1e-5, atol=1e-5)
    token = outputs[1][0][:, -1:].argmax(-1)
    mask, positions = torch.cat([mask, torch.ones_like(token)], dim=1), positions[:, -1:] + 1
    decoded = [fn(token, mask, positions, list(outputs[1][1:])) for fn in (program, step)]
    for traced, eager in zip(decoded[0], decoded[1], strict=True):
        torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-5)


def test_without_attn_res_keys_the_export_has_no_aggregation(tmp_path):
    model = from_hf_folder(write_folder(hf_model("qwen3", seed=12), tmp_path / "qwen3"))
    ids = torch.zeros(1, 4, dtype=torch.int64)
    assert model.aggregation_count() == model.fused_node_count() == 0
    assert _count(torch.export.export(model, (ids,)), attnres_aggregate) == 0
