"""MoE feed-forwards against transformers 5.23's own modules: the tensors its ``save_pretrained`` writes map onto
ours; outputs agree in every dtype and expert path; the exported graph agrees on ONNX Runtime, gathers only the
top-k experts on its decode branch, and resolves routing ties as documented (docs/decode.md#experts-at-decode)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from safetensors.torch import load_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from attnres_export.errors import CheckpointError, ExportError
from attnres_export.exporter.optimize import optimize_exported
from attnres_export.models.layers.moe import EXPERT_PATHS, MoEConfig, MoEFeedForward, expert_state_from_hf
from attnres_export.models.routing import traced_routing
from tests.conftest import slow_after

HIDDEN, INNER, EXPERTS, TOP_K = 32, 16, 8, 2
TOKEN_SHAPES = [(1, 1), (1, 7), (3, 11), (1, 33)]
"""(batch, seq): one token takes the gather branch of the two-branch paths (``gather_max_tokens`` 1), the rest the
other branch."""


@dataclass
class Family:
    """A tiny transformers MoE model, the prefix and module of its MoE block, and our config for that block."""

    name: str
    model: torch.nn.Module
    prefix: str
    config: MoEConfig

    @property
    def block(self) -> torch.nn.Module:
        return self.model.get_submodule(self.prefix.rstrip("."))

    def use(self, implementation: str) -> None:
        self.model.config._experts_implementation = implementation


def qwen3_moe(seed: int = 0) -> Family:
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=HIDDEN, intermediate_size=48, moe_intermediate_size=INNER,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True)
    family = Family("qwen3_moe", Qwen3MoeForCausalLM(config).eval(), "model.layers.0.mlp.",
                    MoEConfig(EXPERTS, TOP_K, INNER, norm_topk_prob=True))
    _randomize(family.block, seed)
    family.use("eager")
    return family


def deepseek_v3(seed: int = 0) -> Family:
    config = DeepseekV3Config(vocab_size=64, hidden_size=HIDDEN, intermediate_size=48, moe_intermediate_size=INNER,
                              num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2,
                              num_key_value_heads=2, n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K, n_group=4,
                              topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                              q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
    family = Family("deepseek_v3", DeepseekV3ForCausalLM(config).eval(), "model.layers.1.mlp.",
                    MoEConfig(EXPERTS, TOP_K, INNER, norm_topk_prob=True, scoring_func="sigmoid",
                              topk_method="noaux_tc", routed_scaling_factor=2.5, n_group=4, topk_group=2,
                              n_shared_experts=1))
    _randomize(family.block, seed)
    family.use("eager")
    return family


FAMILIES = {"qwen3_moe": qwen3_moe, "deepseek_v3": deepseek_v3}


def _randomize(block: torch.nn.Module, seed: int) -> None:
    """Seeded weights wide enough that routing margins are clear, and a random correction bias."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in block.state_dict(keep_vars=True).items():
            std = 0.05 if name.endswith("e_score_correction_bias") else 0.3
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)


def saved_tensors(family: Family, folder: Path, original_format: bool = True) -> dict[str, torch.Tensor]:
    """What ``save_pretrained`` writes for the model, read back from its safetensors."""
    family.model.save_pretrained(folder, save_original_format=original_format)
    return load_file(folder / "model.safetensors")


def ours(family: Family, tensors: dict[str, torch.Tensor], expert_path: str = "gather+grouped") -> MoEFeedForward:
    module = MoEFeedForward(family.config, HIDDEN, expert_path).eval()
    module.load_hf_tensors(family.prefix, tensors)
    return module


def rel_l2(got, expected) -> float:
    got, expected = (np.asarray(v.double() if torch.is_tensor(v) else v, dtype=np.float64) for v in (got, expected))
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def inputs(shape: tuple[int, int], seed: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]()


@pytest.fixture(scope="module")
def per_expert_tensors(family, tmp_path_factory) -> dict[str, torch.Tensor]:
    return saved_tensors(family, tmp_path_factory.mktemp(family.name))


def test_save_pretrained_writes_per_expert_tensors_that_stack_into_transformers_in_memory_layout(
        family, per_expert_tensors):
    assert f"{family.prefix}experts.{EXPERTS - 1}.gate_proj.weight" in per_expert_tensors
    assert f"{family.prefix}experts.gate_up_proj" not in per_expert_tensors
    state = expert_state_from_hf(family.prefix, per_expert_tensors)
    for name, tensor in family.block.state_dict().items():
        assert torch.equal(state[name], tensor), name


def test_stacked_layout_of_save_original_format_false_maps_the_same(family, per_expert_tensors, tmp_path):
    stacked = saved_tensors(family, tmp_path, original_format=False)
    assert f"{family.prefix}experts.gate_up_proj" in stacked
    assert f"{family.prefix}experts.0.gate_proj.weight" not in stacked
    from_stacked = expert_state_from_hf(family.prefix, stacked)
    from_per_expert = expert_state_from_hf(family.prefix, per_expert_tensors)
    assert from_stacked.keys() == from_per_expert.keys()
    assert all(torch.equal(from_stacked[name], from_per_expert[name]) for name in from_stacked)


@pytest.mark.parametrize("implementation", slow_after(["eager", "grouped_mm", "batched_mm"]))
@pytest.mark.parametrize("expert_path", EXPERT_PATHS)
@pytest.mark.parametrize("shape", slow_after([(s,) for s in TOKEN_SHAPES], fast=2), ids=lambda s: f"{s[0]}x{s[1]}")
def test_float32_output_matches_transformers(family, per_expert_tensors, expert_path, shape, implementation):
    module = ours(family, per_expert_tensors, expert_path)
    x = inputs(shape)
    family.use(implementation)
    try:
        with torch.no_grad():
            assert rel_l2(module(x), family.block(x)) <= 1e-5
    finally:
        family.use("eager")


@pytest.mark.parametrize(("dtype", "bar"), [(torch.float16, 5e-3), (torch.bfloat16, 2e-2)], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("expert_path", EXPERT_PATHS)
@pytest.mark.parametrize("shape", slow_after([((1, 1),), ((1, 33),)]), ids=["1x1", "1x33"])
def test_low_precision_output_matches_transformers_in_the_same_dtype(family, per_expert_tensors, expert_path, shape,
                                                                       dtype, bar):
    theirs = copy.deepcopy(family.block).to(dtype)
    module = ours(family, per_expert_tensors, expert_path).to(dtype)
    x = inputs(shape, dtype=dtype)
    with torch.no_grad():
        got, expected = module(x), theirs(x)
    assert got.dtype == expected.dtype == dtype
    assert rel_l2(got, expected) <= bar


def _zero_router(family: Family) -> None:
    """Every expert scores the same: softmax gives 1/E each, sigmoid 1/2 each (with a zero bias)."""
    with torch.no_grad():
        family.block.gate.weight.zero_()
        if hasattr(family.block.gate, "e_score_correction_bias"):
            family.block.gate.e_score_correction_bias.zero_()


@pytest.mark.parametrize("expert_path", EXPERT_PATHS)
def test_routing_ties_resolve_as_in_transformers_in_pytorch(expert_path):
    """Tied experts are chosen by torch.topk in both (on bitwise-equal scores), so PyTorch agrees with
    transformers even where the choice among tied experts is arbitrary; every family and both branches."""
    for build in FAMILIES.values():
        family = build()
        _zero_router(family)
        module = MoEFeedForward(family.config, HIDDEN, expert_path).eval()
        module.load_hf_tensors("", family.block.state_dict())
        for shape in [(1, 1), (1, 33)]:
            x = inputs(shape)
            with torch.no_grad():
                assert rel_l2(module(x), family.block(x)) <= 1e-5, (family.name, shape)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_a_half_sigmoid_router_chooses_by_its_float32_correction_bias(dtype):
    """Equal scores (a zero router) and biases 1e-6 apart, far below either half type's resolution at 0.02: the
    choice follows the float32 bias, as in transformers (which keeps the bias float32) and a float64 top-k."""
    config = MoEConfig(EXPERTS, TOP_K, INNER, norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
                       n_group=4, topk_group=2)
    module = MoEFeedForward(config, HIDDEN).eval()
    bias = 0.02 + 1e-6 * torch.randperm(EXPERTS, generator=torch.Generator().manual_seed(4)).double()
    with torch.no_grad():
        module.gate.weight.zero_()
        module.gate.e_score_correction_bias.copy_(bias)
    module = module.to(dtype)
    assert module.gate.e_score_correction_bias.dtype == torch.float32
    _, chosen = module.gate(inputs((1, 3), dtype=dtype)[0])
    groups = bias.reshape(4, -1).topk(2, dim=-1).values.sum(-1).topk(2).indices
    allowed = torch.cat([torch.arange(g * 2, g * 2 + 2) for g in groups.tolist()])
    want = allowed[bias[allowed].topk(TOP_K).indices]
    assert all(set(row.tolist()) == set(want.tolist()) for row in chosen)


@pytest.mark.parametrize("expert_path", EXPERT_PATHS)
def test_forced_choices_run_the_given_experts_weighted_as_transformers_experts_weigh_them(expert_path, tmp_path):
    """Under ``traced_routing(forced)`` the block runs the given experts (not its top-k) with its router's own
    renormalised probabilities: transformers' experts given the same experts and weights agree."""
    family = qwen3_moe()
    module = ours(family, saved_tensors(family, tmp_path), expert_path)
    for shape in [(1, 1), (1, 9)]:
        x = inputs(shape)
        generator = torch.Generator().manual_seed(shape[1])
        forced = torch.stack([torch.randperm(EXPERTS, generator=generator)[:TOP_K] for _ in range(shape[1])])
        with torch.no_grad(), traced_routing([forced]) as trace:
            got = module(x)
            logits, _, own = family.block.gate(x[0])
            probs = torch.softmax(logits.float(), dim=-1).gather(1, forced)
            want = family.block.experts(x[0], forced, probs / probs.sum(dim=-1, keepdim=True))
        assert torch.equal(trace.chosen[0], forced) and not torch.equal(forced.sort(-1).values, own.sort(-1).values)
        assert rel_l2(got[0], want) <= 1e-5, shape


def float64_softmax_block(module: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Qwen3-MoE's block written out per token in float64: softmax scores, top-k, renormalised, SwiGLU experts.
    (transformers computes its router's softmax in float32 whatever the model dtype, so it is no float64 one.)"""
    state = {k: v.double() for k, v in module.state_dict().items()}
    probs = torch.softmax(x @ state["gate.weight"].T, dim=-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        top = torch.topk(probs[t], TOP_K).indices
        for e in top.tolist():
            gate, up = (state["experts.gate_up_proj"][e] @ x[t]).chunk(2)
            weight = probs[t, e] / probs[t, top].sum()
            out[t] += weight * (state["experts.down_proj"][e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("expert_path", EXPERT_PATHS)
def test_a_float64_block_routes_and_sums_in_float64(family, per_expert_tensors, expert_path):
    """The float64 model is the exact reference of the parity bars: no router score or expert sum of it is
    rounded to float32 (a per-token float64 block agrees to float64 rounding)."""
    module = ours(family, per_expert_tensors, expert_path).double()
    x = inputs((1, 7), dtype=torch.float64)
    with torch.no_grad(), traced_routing() as trace:
        got = module(x)
    assert all(scores.dtype == torch.float64 for scores in trace.scores) and got.dtype == torch.float64
    if family.config.scoring_func == "softmax":
        assert rel_l2(got[0], float64_softmax_block(module, x[0])) <= 1e-12


def test_shared_width_is_moe_intermediate_size_times_shared_experts():
    config = MoEConfig(EXPERTS, TOP_K, INNER, scoring_func="sigmoid", topk_method="noaux_tc", n_group=4, topk_group=2,
                       n_shared_experts=2)
    assert config.shared_size == 2 * INNER


SIGMOID = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"topk_method": "noaux_tc"}, "topk_method 'noaux_tc' is not implemented for scoring_func 'softmax'"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 exceeds num_experts 8"),
    ({**SIGMOID, "n_group": 3}, "not divisible by n_group 3"),
    ({**SIGMOID, "n_group": 8}, "each expert group needs >= 2 experts"),
    ({**SIGMOID, "n_group": 4, "topk_group": 1, "num_experts_per_tok": 3},
     "num_experts_per_tok 3 exceeds the 1 kept groups' experts"),
    ({"n_group": 4, "topk_group": 2}, "group-limited routing"),
    ({"n_shared_experts": 1}, "shared experts are implemented for scoring_func 'sigmoid' only"),
    ({"scoring_func": "tanh"}, "scoring_func must be one of softmax, sigmoid"),
])
def test_config_refuses_what_is_not_implemented_in_one_line(overrides, problem):
    values = {"moe_intermediate_size": INNER, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K}
    with pytest.raises(CheckpointError, match="invalid MoE config") as error:
        MoEConfig(**{**values, **overrides})
    assert problem in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_expert_path_and_negative_gather_bound_are_refused():
    with pytest.raises(ExportError, match=r"expert_path must be one of gather\+grouped, gather\+dense, gather, "):
        MoEFeedForward(MoEConfig(EXPERTS, TOP_K, INNER), HIDDEN, "sparse")
    with pytest.raises(ExportError, match="gather_max_tokens must be >= 0, got -1"):
        MoEFeedForward(MoEConfig(EXPERTS, TOP_K, INNER), HIDDEN, gather_max_tokens=-1)


def test_mapping_refuses_missing_and_left_over_tensors(family, per_expert_tensors):
    prefix = family.prefix
    without = {k: v for k, v in per_expert_tensors.items() if k != f"{prefix}experts.3.up_proj.weight"}
    with pytest.raises(CheckpointError, match=r"experts\.3\.up_proj\.weight is missing"):
        expert_state_from_hf(prefix, without)
    scaled = {**per_expert_tensors, f"{prefix}experts.0.gate_proj.weight_scale_inv": torch.ones(1, 1)}
    with pytest.raises(CheckpointError, match=r"weight_scale_inv: not a tensor of a Qwen3-MoE or DeepSeek"):
        expert_state_from_hf(prefix, scaled)  # a quantized weight's parts are joined by the store, never seen here
    qwen2_shared = {**per_expert_tensors, f"{prefix}shared_expert_gate.weight": torch.ones(1, HIDDEN)}
    with pytest.raises(CheckpointError, match=r"shared_expert_gate\.weight: not a tensor of a Qwen3-MoE or DeepSeek"):
        expert_state_from_hf(prefix, qwen2_shared)
    both = {**per_expert_tensors, f"{prefix}experts.down_proj": torch.ones(EXPERTS, HIDDEN, INNER)}
    with pytest.raises(CheckpointError, match="keep one layout"):
        expert_state_from_hf(prefix, both)
    with pytest.raises(CheckpointError, match="no MoE block here"):
        expert_state_from_hf("model.layers.7.mlp.", per_expert_tensors)


def test_loading_refuses_a_block_of_another_shape_in_one_line(family, per_expert_tensors):
    wider = MoEFeedForward(dataclasses.replace(family.config, moe_intermediate_size=2 * INNER), HIDDEN)
    expected = r"mlp\.experts\.down_proj: shape \[8, 32, 16\] does not match the config's \[8, 32, 32\]"
    with pytest.raises(CheckpointError, match=expected):
        wider.load_hf_tensors(family.prefix, per_expert_tensors)


def _moved(tensors: dict[str, torch.Tensor], source: str, target: str) -> dict[str, torch.Tensor]:
    """The block under ``source`` renamed to ``target``, without the rest of the checkpoint."""
    return {target + name[len(source):]: tensor for name, tensor in tensors.items() if name.startswith(source)}


def test_loading_refuses_the_other_familys_block_naming_the_tensors(tmp_path):
    qwen, deepseek = qwen3_moe(), deepseek_v3()
    with pytest.raises(CheckpointError, match=r"mlp\.gate\.e_score_correction_bias, .* has no place in a block of "
                                              r"scoring_func=softmax, n_shared_experts=0"):
        ours(qwen, _moved(saved_tensors(deepseek, tmp_path / "deepseek"), deepseek.prefix, qwen.prefix))
    with pytest.raises(CheckpointError, match=r"missing model\.layers\.1\.mlp\.gate\.e_score_correction_bias"):
        ours(deepseek, _moved(saved_tensors(qwen, tmp_path / "qwen"), qwen.prefix, deepseek.prefix))


# --- the exported graph ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(family, per_expert_tensors, tmp_path_factory) -> Path:
    """The default module (``gather+grouped``) exported once per family with dynamic batch and sequence (traced at
    2 x 3)."""
    return export(ours(family, per_expert_tensors), tmp_path_factory.mktemp(f"{family.name}-onnx") / "moe.onnx")


def export(module: MoEFeedForward, path: Path) -> Path:
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=4096)
    program = torch.onnx.export(module, (inputs((2, 3)),), dynamic_shapes=({0: batch, 1: seq},), dynamo=True,
                                optimize=False, verbose=False)
    optimize_exported(program.model)
    program.save(str(path))
    return path


def _session(model: onnx.ModelProto | Path) -> onnxruntime.InferenceSession:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (1, 17), (2, 9)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_onnx_runtime_output_matches_transformers_on_both_branches(family, exported, shape):
    """One token runs the gather branch; a decode batch of 4, 17 and 2 x 9 tokens the grouped one."""
    x = inputs(shape)
    got = _session(exported).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        assert rel_l2(got, family.block(x)) <= 1e-5


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {output: node for node in graph.node for output in node.output}


def _traces_to_topk_indices(name: str, graphs: list[onnx.GraphProto]) -> bool:
    """Whether ``name`` is the indices output of a TopK, through shape-only nodes, in ``graphs`` (inner first)."""
    producers = {}
    for graph in reversed(graphs):
        producers.update(_producers(graph))
    while name in producers:
        node = producers[name]
        if node.op_type == "TopK":
            return name == node.output[1]
        if node.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"):
            return False
        name = node.input[0]
    return False


@pytest.mark.slow
def test_decode_branch_gathers_only_the_top_k_experts_weights(exported):
    """The graph's one If takes its then-branch on few tokens; there the stacked expert tensors are read only by
    Gathers indexed by the router's TopK indices (k experts per token), and nothing outside the If reads them."""
    model = onnx.load(str(exported))
    stacks = {"experts.gate_up_proj", "experts.down_proj"}
    assert stacks <= {init.name for init in model.graph.initializer}
    ifs = [node for node in model.graph.node if node.op_type == "If"]
    assert len(ifs) == 1
    condition = _producers(model.graph)[ifs[0].input[0]]
    assert condition.op_type == "LessOrEqual"
    assert not any(stacks & set(node.input) for node in model.graph.node)
    then_branch = next(a.g for a in ifs[0].attribute if a.name == "then_branch")
    readers = [node for node in then_branch.node if stacks & set(node.input)]
    assert sorted(node.input[0] for node in readers) == sorted(stacks)
    for node in readers:
        assert node.op_type == "Gather" and node.input[0] in stacks
        assert _traces_to_topk_indices(node.input[1], [then_branch, model.graph]), node.input[1]
    else_branch = next(a.g for a in ifs[0].attribute if a.name == "else_branch")
    assert [node.op_type for node in else_branch.node].count("Loop") == 1


@pytest.mark.slow
def test_onnx_resolves_routing_ties_to_the_lowest_expert_indices(family, exported):
    """ONNX TopK keeps the lower index among equal values (the spec); torch.topk on the CPU does not promise
    that, so on exact ties the exported graph may choose other experts than transformers (documented). With a
    zero router every expert ties: the graph runs experts 0..k-1 with equal weights, checked against
    transformers' own experts module given those indices."""
    model = onnx.load(str(exported))
    for init in model.graph.initializer:
        if init.name in ("gate.weight", "gate.e_score_correction_bias"):
            init.CopyFrom(onnx.numpy_helper.from_array(np.zeros(tuple(init.dims), np.float32), init.name))
    x = inputs((1, 17))
    got = _session(model).run(None, {"x": x.numpy()})[0]
    tokens = x.reshape(-1, HIDDEN)
    lowest = torch.arange(TOP_K).expand(tokens.shape[0], TOP_K)
    share = 1.0 / TOP_K * family.config.routed_scaling_factor
    with torch.no_grad():
        expected = family.block.experts(tokens, lowest, torch.full((tokens.shape[0], TOP_K), share))
        if family.name == "deepseek_v3":
            expected = expected + family.block.shared_experts(tokens)
    assert rel_l2(got.reshape(-1, HIDDEN), expected) <= 1e-5


@pytest.mark.slow
def test_gather_plus_dense_exports_with_static_shapes_only_and_matches_transformers(tmp_path):
    """The combination that needs no Loop and no NonZero (for runtimes without data-dependent shapes), with the
    gather branch up to a decode batch of 4."""
    family = qwen3_moe()
    tensors = saved_tensors(family, tmp_path / "folder")
    module = MoEFeedForward(family.config, HIDDEN, "gather+dense", gather_max_tokens=4).eval()
    module.load_hf_tensors(family.prefix, tensors)
    path = export(module, tmp_path / "moe.onnx")
    ops = set()
    model = onnx.load(str(path))
    for node in model.graph.node:
        ops.add(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                ops.update(inner.op_type for inner in attribute.g.node)
    assert "If" in ops and "Gather" in ops
    assert not ops & {"Loop", "NonZero"}
    for shape in [(4, 1), (1, 17)]:
        x = inputs(shape)
        with torch.no_grad():
            assert rel_l2(_session(path).run(None, {"x": x.numpy()})[0], family.block(x)) <= 1e-5
