"""Routed experts as ONNX Runtime's ``MoE``: each experts ``If`` of a Qwen3-MoE or DeepSeek-V3 export becomes exactly
one ``MoE`` node, and the rewritten graph, on plain ONNX Runtime, computes what transformers computes (the MoE block
of tests/models/decoder/test_moe.py, and whole tiny folders, plain and with past, at one token and an odd batch of
odd length); routing weights that are zero, equal or all zero pass through the routing-probability construction
exactly; experts the op cannot compute (Kimi K3's SiTU activation) stay as they were and say why (quantized experts:
test_qmoe.py)."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from attnres_export.dims import DimRange
from attnres_export.graphs.onnxruntime_ops.experts import mixture_of_experts
from attnres_export.models.kimi.mlp import Activation, KimiMoE
from attnres_export.models.layers.moe import MoEConfig
from tests.conftest import slow_after
from tests.models.decoder.hf_bodies import hf_model, relative_l2, write_folder
from tests.models.decoder.test_moe import (
    EXPERTS,
    HIDDEN,
    INNER,
    TOP_K,
    deepseek_v3,
    export,
    inputs,
    ours,
    qwen3_moe,
    rel_l2,
    saved_tensors,
)

BLOCK_BAR = 1e-5
"""The block's relative L2 against transformers (test_moe's bar for the exported block)."""
LOGITS_BAR = 1e-5
"""Float32 logits against transformers (tests/models/decoder/test_families.py's bar)."""
SHAPES = [(1, 1), (3, 5)]
"""(batch, seq): one token runs the gather branch of the replaced If, 15 tokens the grouped one."""


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


class _Blocks:
    """Each family's MoE block (``gather+grouped``) exported on first use, traced at 2 x 3 with dynamic batch and
    seq (about 12 s each)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.paths = folder, {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.paths:
            family = BLOCK_FAMILIES[name]()
            folder = self.folder / name
            self.paths[name] = export(ours(family, saved_tensors(family, folder)), folder / "moe.onnx")
        return self.paths[name]


BLOCK_FAMILIES = {"qwen3_moe": qwen3_moe, "deepseek_v3": deepseek_v3}


@pytest.fixture(scope="module")
def blocks(tmp_path_factory) -> _Blocks:
    return _Blocks(tmp_path_factory.mktemp("blocks"))


@pytest.mark.parametrize("name", slow_after(["deepseek_v3", "qwen3_moe"]))
def test_the_experts_if_of_a_block_becomes_one_moe_node_that_matches_transformers_on_both_branches(blocks, name):
    family = BLOCK_FAMILIES[name]()
    model = onnx.load(blocks[name])
    assert _ops(model)["If"] == 1
    rewrite = mixture_of_experts(model)
    assert (rewrite.rewritten, rewrite.of, rewrite.kept) == (1, 1, [])
    ops = _ops(model)
    assert (ops["If"], ops["Loop"], ops["MoE"]) == (0, 0, 1)
    onnx.checker.check_model(model)
    session = _session(model)
    for shape in [*SHAPES, (4, 1), (1, 17)]:
        x = inputs(shape, seed=3)
        with torch.no_grad():
            assert rel_l2(session.run(None, {"x": x.numpy()})[0], family.block(x)) <= BLOCK_BAR, shape


@pytest.mark.parametrize("second_expert", ["same_as_first", "constant_half"])
def test_zero_equal_and_all_zero_routing_weights_go_through_moe_exactly(blocks, second_expert):
    """DeepSeek-V3's router steered onto experts 0 and 1 (correction bias 1): expert 0 scores sigmoid(-1e6 x_0),
    exactly 0 or 1; expert 1 the same (all-zero or equal weights) or 0.5 (one zero weight)."""
    family = deepseek_v3()
    weight = torch.randn(EXPERTS, HIDDEN, generator=torch.Generator().manual_seed(4)) * 0.3
    weight[0] = 0
    weight[0, 0] = -1e6
    weight[1] = weight[0] if second_expert == "same_as_first" else 0
    bias = torch.zeros(EXPERTS)
    bias[:2] = 1
    with torch.no_grad():
        family.block.gate.weight.copy_(weight)
        family.block.gate.e_score_correction_bias.copy_(bias)
    model = onnx.load(blocks["deepseek_v3"])
    for init in model.graph.initializer:
        if init.name in ("gate.weight", "gate.e_score_correction_bias"):
            init.CopyFrom(onnx.numpy_helper.from_array((weight if init.name == "gate.weight" else bias).numpy(),
                                                       init.name))
    assert mixture_of_experts(model).rewritten == 1
    session = _session(model)
    routed = ours(family, {family.prefix + k: v for k, v in family.block.state_dict().items()})
    seen = set()
    for shape in [(1, 1), (3, 5), (1, 9)]:
        x = inputs(shape, seed=5)
        with torch.no_grad():
            routing, chosen = routed.gate(x.reshape(-1, HIDDEN))
            assert rel_l2(session.run(None, {"x": x.numpy()})[0], family.block(x)) <= BLOCK_BAR, shape
        assert (chosen.sort(dim=1).values == torch.tensor([0, 1])).all()
        for row in routing:
            seen.add("all zero" if not row.any() else "one zero" if not row.all() else
                     "equal" if row[0] == row[1] else "distinct")
    assert seen == ({"all zero", "equal"} if second_expert == "same_as_first" else {"one zero", "distinct"})


def test_kimi_k3_situ_experts_stay_in_standard_ops_and_say_why(tmp_path):
    torch.manual_seed(6)
    config = MoEConfig(EXPERTS, TOP_K, INNER, norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
                       routed_scaling_factor=2.5, n_group=4, topk_group=2, n_shared_experts=1)
    block = KimiMoE(config, HIDDEN, Activation("situ", 4.0, 25.0), None, False, 1e-5).eval()
    model = onnx.load(export(block, tmp_path / "k3.onnx"))
    before = model.SerializeToString()
    rewrite = mixture_of_experts(model)
    assert (rewrite.rewritten, rewrite.of) == (0, 1)
    assert len(rewrite.kept) == 1
    assert "Tanh" in rewrite.kept[0] and "not silu(gate) * up" in rewrite.kept[0] and "SiTU" in rewrite.kept[0]
    assert model.SerializeToString() == before


# --- whole folders against transformers -----------------------------------------------------------------------------


def _qwen3_moe_folder(path: Path):
    reference = hf_model("qwen3_moe", seed=7, num_hidden_layers=2, mlp_only_layers=[], num_experts=8)
    return reference, write_folder(reference, path)


def _deepseek_v3_folder(path: Path):
    """Grouped routing (4 groups, 2 kept), a random correction bias, scaling 2.5, one shared expert."""
    reference = hf_model("deepseek_v3", seed=8, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8,
                         n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True)
    with torch.no_grad():
        bias = reference.model.layers[1].mlp.gate.e_score_correction_bias
        bias.copy_(0.05 * torch.randn(bias.shape, generator=torch.Generator().manual_seed(9)))
    return reference, write_folder(reference, path)


FOLDERS = {"qwen3_moe": (_qwen3_moe_folder, 2), "deepseek_v3": (_deepseek_v3_folder, 1)}
"""Folder builder and MoE layer count."""


def _export(folder: Path, out: Path, *, with_past: bool, quantize: str | None = None, block: int = 32
            ) -> onnx.ModelProto:
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    export_checkpoint(ExportOptions(folder, out, target="portable", with_past=with_past, seq=DimRange(1, 8, 32),
                                    past=DimRange(0, 8, 31) if with_past else None, check=False, quantize=quantize,
                                    quantize_block_size=block))
    return onnx.load(str(out))


def _feeds(session: ort.InferenceSession, ids: torch.Tensor) -> dict[str, np.ndarray]:
    """``input_ids`` and, for a with-past graph, a full mask, positions from 0 and an empty cache."""
    batch, seq = ids.shape
    feeds = {"input_ids": ids.numpy()}
    for value in session.get_inputs():
        if value.name == "attention_mask":
            feeds[value.name] = np.ones((batch, seq), np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
        elif value.name != "input_ids":
            shape = [batch if d == "batch" else 0 if isinstance(d, str) else d for d in value.shape]
            feeds[value.name] = np.zeros(shape, np.float32)
    return feeds


@pytest.mark.slow
@pytest.mark.parametrize("with_past", [False, True], ids=["plain", "with_past"])
@pytest.mark.parametrize("family", sorted(FOLDERS))
@torch.inference_mode()
def test_rewritten_folder_exports_give_transformers_logits(tmp_path, family, with_past):
    build, layers = FOLDERS[family]
    reference, folder = build(tmp_path / family)
    model = _export(folder, tmp_path / "model.onnx", with_past=with_past)
    # a with-past latent-attention layer holds an If of its own (models/layers/latent_attention.py): not an expert's
    attention = sum(n.op_type == "If" and "self_attn" in n.name for n in model.graph.node)
    assert _ops(model)["If"] == layers + attention
    rewrite = mixture_of_experts(model)
    assert (rewrite.rewritten, rewrite.of, rewrite.kept) == (layers, layers, [])
    ops = _ops(model)
    assert (ops["If"], ops["MoE"]) == (attention, layers)
    session = _session(model)
    g = torch.Generator().manual_seed(10)
    for batch, seq in SHAPES:
        ids = torch.randint(0, reference.config.vocab_size, (batch, seq), generator=g)
        got = torch.from_numpy(session.run(["logits"], _feeds(session, ids))[0])
        assert relative_l2(got, reference(ids).logits) <= LOGITS_BAR, (batch, seq)
