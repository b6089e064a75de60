"""Routed mixture-of-experts feed-forwards of Qwen3-MoE and DeepSeek-V3 with transformers 5.23's semantics.

``MoEFeedForward(config, hidden_size)`` computes what transformers' ``Qwen3MoeSparseMoeBlock``
(``scoring_func="softmax"``) and ``DeepseekV3MoE`` (``"sigmoid"``) compute, holds its tensors under their names
(``gate.weight``, ``gate.e_score_correction_bias``, ``experts.gate_up_proj`` [E, 2I, D], ``experts.down_proj``
[E, D, I], ``shared_experts.*``), and is written for export: one graph serves prefill and decode under dynamic batch and
sequence, and a decode step reads only the selected experts' weights. The expert computation has three forms
(docs/decode.md#experts-at-decode has the node-level reasons and the measured effect of each):

- ``gather``: ``Gather`` the top-k experts' weights of every token out of the stacked tensors, then a batched
  ``MatMul``. Static shapes and a handful of nodes; it copies ``N * k`` experts' weights for ``N`` tokens.
- ``grouped``: a loop over the experts some token chose (an ONNX ``Loop``); each iteration gathers that expert's
  weights and its tokens (``NonZero``) and runs one matrix product on them. Each chosen expert is copied once
  and only routed tokens are computed; shapes inside the loop depend on the routing.
- ``dense``: every expert on every token, weighted by routing weights that are zero for unselected experts.
  ``E / k`` times the routed work: the all-experts baseline, static shapes.

``expert_path`` is one form or two joined by ``+``: ``"gather+grouped"`` (the default) is ``gather`` while the
call has at most ``gather_max_tokens`` tokens and ``grouped`` above. In an export that is a ``torch.cond`` on
the token count, an ONNX ``If``; eager PyTorch takes the same branch with Python control flow.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from attnres_export.errors import CheckpointError, ExportError
from attnres_export.models.base import KeepFloat32
from attnres_export.models.config import Config
from attnres_export.models.limits import EXPERT_COUNT, EXPERTS, MULTIPLIER, WIDTH, Range
from attnres_export.models.routing import top_k_experts
from attnres_export.ops.precision import at_least_float32

ROUTERS = {"softmax": "greedy", "sigmoid": "noaux_tc"}
"""``scoring_func`` -> its ``topk_method``.
``softmax``: Qwen3-MoE (softmax over experts, top-k, optional renormalisation). ``sigmoid``: DeepSeek-V3's
``noaux_tc`` (sigmoid scores, a correction bias used for selection only, group-limited top-k, scaling)."""
EXPERT_FORMS = ("gather", "grouped", "dense")
EXPERT_PATHS = ("gather+grouped", "gather+dense", *EXPERT_FORMS)
GATHER_MAX_TOKENS = 1
"""On ONNX Runtime CPU ``gather`` and ``grouped`` tie on one token and ``grouped`` is ahead from two
(docs/decode.md#experts-at-decode)."""
INIT_STD = 0.02


@dataclass(frozen=True)
class MoEConfig(Config):
    """The mixture-of-experts settings of a body in transformers' ``config.json`` names (a ``decoder-lm``
    checkpoint stores them so, under ``moe``); the feed-forwards below are built from it and the body's
    ``hidden_size``. Routing follows the family: ``qwen3_moe`` is softmax top-k (``scoring_func="softmax"``,
    ``topk_method="greedy"``), ``deepseek_v3`` and Kimi Linear sigmoid scores with group-limited top-k and a
    score-correction bias (``"sigmoid"``, ``"noaux_tc"``)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool = False
    scoring_func: str = "softmax"
    topk_method: str = "greedy"
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int | None = None
    """None: one group (no group-limited routing)."""
    topk_group: int | None = None

    KIND: ClassVar[str] = "MoE"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"n_shared_experts", "routed_scaling_factor", "n_group",
                                                    "topk_group"})
    RANGES: ClassVar[dict[str, Range]] = {
        "num_experts": EXPERT_COUNT, "num_experts_per_tok": EXPERTS, "moe_intermediate_size": WIDTH,
        "n_shared_experts": EXPERT_COUNT, "routed_scaling_factor": MULTIPLIER, "n_group": EXPERTS,
        "topk_group": EXPERTS}

    def problems(self) -> Iterator[str]:
        ranges = list(super().problems())
        if ranges:
            yield from ranges
            return
        if self.scoring_func not in ROUTERS:
            yield f"scoring_func must be one of {', '.join(ROUTERS)}, got {self.scoring_func!r}"
        elif self.topk_method != ROUTERS[self.scoring_func]:
            yield (f"topk_method {self.topk_method!r} is not implemented for scoring_func {self.scoring_func!r} "
                   f"(only {ROUTERS[self.scoring_func]!r})")
        if self.num_experts_per_tok > self.num_experts:
            yield f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts {self.num_experts}"
        if self.scoring_func == "softmax":
            yield from self._softmax_problems()
        elif self.scoring_func == "sigmoid":
            yield from self._sigmoid_problems()

    def _softmax_problems(self) -> Iterator[str]:
        if self.groups != (1, 1):
            yield "group-limited routing (n_group, topk_group) is implemented for scoring_func 'sigmoid' only"
        if self.routed_scaling_factor != 1.0:
            yield "routed_scaling_factor is implemented for scoring_func 'sigmoid' only (Qwen3-MoE does not scale)"
        if self.n_shared_experts:
            yield "shared experts are implemented for scoring_func 'sigmoid' only (Qwen3-MoE has none)"

    def _sigmoid_problems(self) -> Iterator[str]:
        n_group, topk_group = self.groups
        if self.num_experts % n_group:
            yield f"num_experts {self.num_experts} is not divisible by n_group {n_group}"
        elif n_group > 1 and self.num_experts // n_group < 2:
            yield "each expert group needs >= 2 experts (a group scores by its two best experts)"
        elif self.num_experts_per_tok > topk_group * (self.num_experts // n_group):
            yield f"num_experts_per_tok {self.num_experts_per_tok} exceeds the {topk_group} kept groups' experts"
        if topk_group > n_group:
            yield f"topk_group {topk_group} exceeds n_group {n_group}"

    @property
    def groups(self) -> tuple[int, int]:
        """``(n_group, topk_group)``, one group where they are not set."""
        return self.n_group or 1, self.topk_group or 1

    @property
    def shared_size(self) -> int:
        """Width of the shared experts' MLP: DeepSeek-V3's ``moe_intermediate_size * n_shared_experts``."""
        return self.moe_intermediate_size * self.n_shared_experts


def _swiglu(gate_up: torch.Tensor, dim: int) -> torch.Tensor:
    """``silu(gate) * up`` of a fused projection whose first half along ``dim`` is the gate (transformers'
    ``gate_up_proj`` order)."""
    gate, up = gate_up.chunk(2, dim=dim)
    return F.silu(gate) * up


def _accumulation(x: torch.Tensor) -> torch.dtype:
    """The type the expert sum accumulates in: float32, float64 in a float64 model (the exact reference)."""
    return torch.promote_types(x.dtype, torch.float32)


class SoftmaxTopKRouter(nn.Module):
    """Qwen3-MoE's router (``Qwen3MoeTopKRouter``): logits in the model dtype, softmax in float32, top-k,
    renormalised when ``norm_topk_prob``, weights cast back to the model dtype."""

    def __init__(self, config: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.randn(config.num_experts, hidden_size) * INIT_STD)

    def forward(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x2, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        weights, indices = top_k_experts(probs, self.top_k)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), indices


class SigmoidGroupTopKRouter(KeepFloat32):
    """DeepSeek-V3's router (``DeepseekV3TopkRouter``), in float32 (float64 in a float64 model): sigmoid scores; the
    correction bias, held float32 in every model dtype (transformers' ``_keep_in_fp32_modules_strict``, vLLM and
    SGLang create it float32), is added for choosing only; groups ranked by their two best biased scores keep
    ``topk_group`` of ``n_group``; the top-k experts of the kept groups are weighted by their unbiased scores,
    renormalised when ``norm_topk_prob`` (``+ 1e-20``), times ``routed_scaling_factor``. Every top-k is sorted
    where transformers asks for ``sorted=False`` (onnx-tensorrt's operator table wants ``sorted=1``): the order
    only changes the order of the expert sum; that sorted and unsorted calls pick the same experts among exact
    ties holds in the tests on the CPU but is no documented promise of torch (docs/decode.md#routing-ties)."""

    FLOAT32_TENSORS = frozenset({"e_score_correction_bias"})

    def __init__(self, config: MoEConfig, hidden_size: int) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.groups
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.randn(config.num_experts, hidden_size) * INIT_STD)
        self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))

    def forward(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = F.linear(at_least_float32(x2), at_least_float32(self.weight)).sigmoid()
        choice = scores + self.e_score_correction_bias
        if self.topk_group < self.n_group:
            choice = self._keep_best_groups(choice)
        indices = top_k_experts(choice, self.top_k, unbiased=scores)[1]
        weights = scores.gather(1, indices)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, indices

    def _keep_best_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """``choice`` with the experts outside the ``topk_group`` best groups set to -inf."""
        tokens, experts = choice.shape
        per_group = experts // self.n_group
        group_scores = choice.reshape(tokens, self.n_group, per_group).topk(2, dim=-1).values.sum(dim=-1)
        best_groups = torch.topk(group_scores, self.topk_group, dim=-1).indices
        group_mask = torch.zeros_like(group_scores).scatter(1, best_groups, 1.0)
        expert_mask = group_mask.unsqueeze(-1).expand(tokens, self.n_group, per_group).reshape(tokens, experts)
        return choice.masked_fill(expert_mask == 0, float("-inf"))


class StackedExperts(nn.Module):
    """The routed experts as two stacked tensors (transformers 5.23's in-memory layout): ``gate_up_proj``
    [E, 2I, D] (gate rows first) and ``down_proj`` [E, D, I]. ``forward(x2 [N, D], indices [N, k], weights
    [N, k]) -> [N, D]`` sums each token's experts times their routing weights (products in the promoted dtype of
    activations and weights, as transformers multiplies; the sum in float32)."""

    MATMUL_WEIGHTS = ("gate_up_proj", "down_proj")
    """Parameters used as matmul weights, input axis last (``models.base.matmul_weight_names``)."""

    def __init__(self, config: MoEConfig, hidden_size: int, expert_path: str = "gather+grouped",
                 gather_max_tokens: int = GATHER_MAX_TOKENS) -> None:
        super().__init__()
        if expert_path not in EXPERT_PATHS:
            raise ExportError(f"expert_path must be one of {', '.join(EXPERT_PATHS)}, got {expert_path!r}")
        if gather_max_tokens < 0:
            raise ExportError(f"gather_max_tokens must be >= 0, got {gather_max_tokens}")
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.expert_path = expert_path
        self.gather_max_tokens = gather_max_tokens
        experts, hidden, inner = config.num_experts, hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inner, hidden) * INIT_STD)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, inner) * INIT_STD)

    def activate(self, gate_up: torch.Tensor, dim: int) -> torch.Tensor:
        """The gated activation of a fused ``gate_up`` projection (SwiGLU; Kimi K3's experts override it)."""
        return _swiglu(gate_up, dim)

    def forward(self, x2: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        forms = {"gather": self.gathered, "grouped": self.grouped, "dense": self.dense}
        few, _, many = self.expert_path.partition("+")
        if not many:
            return forms[few](x2, indices, weights)
        few_tokens = x2.shape[0] <= self.gather_max_tokens
        if isinstance(few_tokens, torch.SymBool):
            return torch.cond(few_tokens, forms[few], forms[many], (x2, indices, weights))
        return forms[few if few_tokens else many](x2, indices, weights)

    def gathered(self, x2: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each token's k experts gathered from the stacks (``Gather`` by the top-k indices), then batched
        matrix-vector products: [N, k, 2I, D] @ [N, 1, D, 1]."""
        tokens, top_k = indices.shape
        flat = indices.reshape(-1)
        gate_up = torch.index_select(self.gate_up_proj, 0, flat).reshape(tokens, top_k, *self.gate_up_proj.shape[1:])
        hidden = self.activate((gate_up @ x2[:, None, :, None]).squeeze(-1), dim=-1)
        down = torch.index_select(self.down_proj, 0, flat).reshape(tokens, top_k, *self.down_proj.shape[1:])
        out = (down @ hidden.unsqueeze(-1)).squeeze(-1)
        return (out * weights.unsqueeze(-1)).sum(dim=1, dtype=_accumulation(x2)).to(x2.dtype)

    def grouped(self, x2: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """A loop over the experts some token chose; each runs once on its own tokens (transformers' eager
        order). Exported, the loop is a ``torch.while_loop`` (an ONNX ``Loop``) whose trip count is the number
        of distinct chosen experts."""
        out = torch.zeros(x2.shape, dtype=_accumulation(x2), device=x2.device)
        chosen = torch.zeros(self.num_experts, dtype=torch.int32, device=x2.device).scatter(0, indices.reshape(-1), 1)
        experts = torch.nonzero(chosen).squeeze(1)
        if not torch.compiler.is_exporting():
            for expert in experts:
                out = self._add_expert(expert, out, x2, indices, weights)
            return out.to(x2.dtype)
        count = chosen.sum()

        def more(step: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
            return step < count

        def body(step: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            expert = torch.index_select(experts, 0, step.reshape(1)).squeeze(0)
            return step + 1, self._add_expert(expert, acc, x2, indices, weights)

        start = torch.zeros((), dtype=torch.int64, device=x2.device)
        return torch.while_loop(more, body, (start, out))[1].to(x2.dtype)

    def _add_expert(self, expert: torch.Tensor, out: torch.Tensor, x2: torch.Tensor, indices: torch.Tensor,
                    weights: torch.Tensor) -> torch.Tensor:
        """``out`` plus one expert's weighted output on the tokens that chose it. A token chooses an expert at
        most once, so the update is a plain ``ScatterElements`` (TensorRT's ``ScatterND`` takes no reduction)."""
        pairs = torch.nonzero(indices == expert)
        tokens = pairs[:, 0]
        slots = tokens * self.top_k + pairs[:, 1]
        gate_up = torch.index_select(self.gate_up_proj, 0, expert.reshape(1)).squeeze(0)
        hidden = self.activate(F.linear(torch.index_select(x2, 0, tokens), gate_up), dim=-1)
        down = torch.index_select(self.down_proj, 0, expert.reshape(1)).squeeze(0)
        routed = F.linear(hidden, down) * torch.index_select(weights.reshape(-1), 0, slots).unsqueeze(-1)
        update = torch.index_select(out, 0, tokens) + routed.to(out.dtype)
        return out.scatter(0, tokens.unsqueeze(-1).expand_as(update), update)

    def dense(self, x2: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every expert on every token ([E, 2I, D] @ [D, N]), weighted by a routing matrix [N, E] that is zero
        outside each token's top-k: the all-experts baseline."""
        routing = torch.zeros(x2.shape[0], self.num_experts, dtype=weights.dtype, device=x2.device)
        routing = routing.scatter(1, indices, weights)
        hidden = self.activate(self.gate_up_proj @ x2.transpose(0, 1), dim=1)
        out = self.down_proj @ hidden
        weighted = out * routing.transpose(0, 1).unsqueeze(1)
        return weighted.sum(dim=0, dtype=_accumulation(x2)).transpose(0, 1).contiguous().to(x2.dtype)


class SharedExperts(nn.Module):
    """DeepSeek-V3's always-on experts: one SwiGLU MLP (``DeepseekV3MLP``) on every token."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEFeedForward(nn.Module):
    """A routed MoE feed-forward, ``forward(x [B, T, D]) -> [B, T, D]``: router, routed experts, and for
    DeepSeek-V3 the shared experts added on top."""

    def __init__(self, config: MoEConfig, hidden_size: int, expert_path: str = "gather+grouped",
                 gather_max_tokens: int = GATHER_MAX_TOKENS) -> None:
        super().__init__()
        self.config = config
        router = SoftmaxTopKRouter if config.scoring_func == "softmax" else SigmoidGroupTopKRouter
        self.gate = router(config, hidden_size)
        self.experts = StackedExperts(config, hidden_size, expert_path, gather_max_tokens)
        self.shared_experts = SharedExperts(hidden_size, config.shared_size) if config.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        weights, indices = self.gate(x2)
        out = self.experts(x2, indices, weights).reshape(x.shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

    def load_hf_tensors(self, prefix: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Load the block under ``prefix`` of a transformers checkpoint (either expert layout), refusing tensors
        that are missing, left over or of the wrong shape in one line."""
        state = expert_state_from_hf(prefix, tensors)
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        if missing:
            raise CheckpointError(f"{prefix}: missing {', '.join(prefix + name for name in missing)}")
        unused = sorted(set(state) - set(own))
        if unused:
            cfg = self.config
            raise CheckpointError(f"{prefix}: {', '.join(prefix + name for name in unused)} has no place in a block "
                                  f"of scoring_func={cfg.scoring_func}, n_shared_experts={cfg.n_shared_experts}")
        for name, tensor in sorted(state.items()):
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise CheckpointError(f"{prefix}{name}: shape {list(tensor.shape)} does not match the config's "
                                      f"{list(own[name].shape)}")
        self.load_state_dict(state)


_PER_EXPERT = re.compile(r"experts\.([0-9]{1,6})\.(gate_proj|up_proj|down_proj)\.weight")
"""A per-expert tensor; an index of more digits than any expert count (``limits.MAX_EXPERTS``) names none."""
_BLOCK_TENSORS = frozenset({
    "gate.weight", "gate.e_score_correction_bias", "experts.gate_up_proj", "experts.down_proj",
    "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight", "shared_experts.down_proj.weight",
})


def expert_state_from_hf(prefix: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict of a ``MoEFeedForward`` from the tensors of one MoE block of a transformers checkpoint.

    ``prefix`` names the block (``"model.layers.3.mlp."``); ``tensors`` maps checkpoint names to tensors (only
    names under ``prefix`` are read, so a lazy mapping over a whole folder works). Routed experts come in one of
    two layouts: per expert, ``experts.{j}.gate_proj.weight`` [I, D], ``up_proj`` [I, D], ``down_proj`` [D, I]
    (published checkpoints, and what ``save_pretrained`` writes by default in 5.23), stacked here into
    ``experts.gate_up_proj`` [E, 2I, D] (gate rows, then up rows) and ``experts.down_proj`` [E, D, I]; or
    already stacked under those two names (``save_pretrained(save_original_format=False)``, the in-memory
    form). ``gate.*`` and ``shared_experts.*`` are passed through. Any other name under ``prefix`` is refused
    in one line (Qwen2-MoE's gated ``shared_expert``)."""
    state: dict[str, torch.Tensor] = {}
    per_expert: dict[tuple[int, str], torch.Tensor] = {}
    for name in tensors:
        if not name.startswith(prefix):
            continue
        local = name[len(prefix):]
        match = _PER_EXPERT.fullmatch(local)
        if match:
            per_expert[(int(match[1]), match[2])] = tensors[name]
        elif local in _BLOCK_TENSORS:
            state[local] = tensors[name]
        else:
            raise CheckpointError(f"{name}: not a tensor of a Qwen3-MoE or DeepSeek-V3 MoE block")
    if per_expert:
        stacked = sorted({"experts.gate_up_proj", "experts.down_proj"} & set(state))
        if stacked:
            raise CheckpointError(f"{prefix}: holds both per-expert tensors and {', '.join(stacked)}; keep one layout")
        state.update(_stack_experts(prefix, per_expert))
    missing = sorted({"gate.weight", "experts.gate_up_proj", "experts.down_proj"} - set(state))
    if missing:
        raise CheckpointError(f"{prefix}: no MoE block here (missing {', '.join(prefix + name for name in missing)})")
    return state


def _stack_experts(prefix: str, per_expert: Mapping[tuple[int, str], torch.Tensor]) -> dict[str, torch.Tensor]:
    """``experts.{j}.*`` stacked in expert order, refusing a missing expert or experts of different shapes."""
    count = 1 + max(index for index, _ in per_expert)
    projections = ("gate_proj", "up_proj", "down_proj")
    for index in range(count):
        for projection in projections:
            if (index, projection) not in per_expert:
                raise CheckpointError(f"{prefix}experts.{index}.{projection}.weight is missing "
                                      f"(the block has experts up to {count - 1})")
    for projection in projections:
        shapes = {tuple(per_expert[(index, projection)].shape) for index in range(count)}
        if len(shapes) > 1:
            raise CheckpointError(f"{prefix}experts.*.{projection}.weight: experts differ in shape {sorted(shapes)}")
    if per_expert[(0, "gate_proj")].shape != per_expert[(0, "up_proj")].shape:
        raise CheckpointError(f"{prefix}experts.*: gate_proj and up_proj differ in shape")

    def stack(projection: str) -> torch.Tensor:
        return torch.stack([per_expert[(index, projection)] for index in range(count)])

    return {"experts.gate_up_proj": torch.cat([stack("gate_proj"), stack("up_proj")], dim=1),
            "experts.down_proj": stack("down_proj")}
