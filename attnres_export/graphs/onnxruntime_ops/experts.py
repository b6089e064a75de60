"""The routed experts of Qwen3-MoE, DeepSeek-V3 and Kimi Linear as ONNX Runtime's ``MoE`` contrib op
(docs/onnxruntime-target.md#experts).

``StackedExperts`` (models/layers/moe.py) exports, under its default ``expert_path="gather+grouped"``, as an ``If``
on the token count: the then-branch gathers each token's top-k experts out of the stacked ``gate_up_proj``
[E, 2I, D] (gate rows first) and ``down_proj`` [E, D, I]; the else-branch loops over the chosen experts. Both
compute ``out[t] = sum_j weights[t, j] * down[e] @ (silu(gate[e] @ x2[t]) * (up[e] @ x2[t]))``, ``e =
indices[t, j]``, from three values of the enclosing graph: ``x2`` [N, D], ``indices`` [N, k] and ``weights`` [N, k]
(the router, Qwen3-MoE's softmax top-k or DeepSeek-V3's group-limited sigmoid top-k with its scaling, stays in
standard ops before them). The experts ``If`` is the one whose branches read two rank-3 initializers shaped
[E, 2I, D] and [E, D, I]; ``x2``, ``indices`` and ``weights`` are found from how its gather branch uses them:

    Gather(gate_up, Reshape*(indices)) -> Reshape -> MatMul(., Unsqueeze*(x2)) -> Squeeze -> Split(2, last axis)
    -> Mul(Mul(g, Sigmoid(g)), u) -> Unsqueeze -> MatMul(Reshape(Gather(down_proj, Reshape*(indices))), .)
    -> Squeeze -> Mul(., Unsqueeze(weights)) -> Cast? -> ReduceSum(axis 1) -> Cast?

ONNX Runtime's ``MoE`` takes routing probabilities, not a routing: its CPU kernel (1.32) takes the softmax of
``router_probs`` over all experts, keeps the top k and, with ``normalize_routing_weights=1``, divides them by their
sum. Any routing goes through that exactly: ``router_probs`` is a fill far below every chosen expert with
``log(weights / sum(weights))`` scattered at ``indices``, so the top k are the chosen experts and their softmax
weights are ``weights / sum(weights)``; the op's output times ``sum(weights)`` is the routed sum (weights clamped to
float32's smallest normal first, so a zero weight contributes nothing and an all-zero routing gives zero). The
op's CPU SwiGLU is ``G * sigmoid(alpha * G) * (L + beta)`` on interleaved ``[g0, l0, g1, l1, ...]`` rows only
(``swiglu_fusion=1``), so the rewrite reorders ``gate_up_proj``'s rows in place (a copy when another node reads
it) and sets ``alpha=1``,
``beta=0`` and no limit: ``silu(g) * l``.

Quantized experts (the gather branch dequantizes the gathered blocks before the MatMuls) become ``QMoE`` the same
way, their stacks rewritten in its layout by qmoe.py. Kept in standard ops, one line per kind in
``ExpertsRewrite.kept``: experts whose activation is not ``silu(gate) * up`` (Kimi K3's SiTU), quantized experts
``QMoE`` does not compute exactly (qmoe.py), a model type the CPU kernel does not take (bfloat16), and a gather
branch written another way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from attnres_export.graphs.onnxruntime_ops import qmoe
from attnres_export.graphs.onnxruntime_ops.nodes import (
    MS_DOMAIN,
    Nodes,
    all_nodes,
    attr,
    constant_value,
    drop_dead_nodes,
    import_microsoft_domain,
    reads,
)

MOE_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
"""Types ONNX Runtime's CPU ``MoE`` kernel takes (bfloat16 has none)."""
FILL = -1.0e4
"""``router_probs`` of the experts a token did not choose: far below ``log`` of float32's smallest normal (-87.3),
so the kernel's top-k never prefers them and their softmax weight is 0; finite in float16."""
TINY = float(np.finfo(np.float32).tiny)
_QUIET = ("Reshape", "Unsqueeze", "Squeeze")
"""Nodes between the gather branch's values and the enclosing graph's that change no value."""


@dataclass
class ExpertsRewrite:
    rewritten: int
    """Experts ``If`` nodes now computed by one ``MoE`` or ``QMoE`` node each."""
    of: int
    """Experts ``If`` nodes in the model."""
    kept: list[str] = field(default_factory=list)
    """One line per kind of experts left in standard ops, with the reason."""
    reordered: list[str] = field(default_factory=list)
    """Initializers whose rows were reordered in place: they no longer hold the state_dict tensor of their name."""
    quantized: int = 0
    """How many of ``rewritten`` are ``QMoE`` nodes (quantized experts)."""


@dataclass
class _Experts:
    """One matched experts ``If``: its enclosing-graph operands and the facts the ``MoE`` node needs."""

    node: onnx.NodeProto
    x2: str
    indices: str
    weights: str
    gate_up: str
    down: str
    gate_first: bool
    top_k: int
    dtype: int
    quantized: qmoe.Quantized | None = None
    """The stacks' quantization, for ``QMoE``; None: float stacks, for ``MoE``."""


def mixture_of_experts(model: onnx.ModelProto, data_dir: Path | None = None) -> ExpertsRewrite:
    """Rewrite ``model`` in place: each experts ``If`` whose experts ``MoE`` computes becomes one ``MoE`` node
    (module docstring); the others stay and say why, once per kind. ``data_dir``: the folder of a model whose
    weights are in external data files that this rewrite may change in place (an export's private staging folder,
    never a user's file); without it, externally stored experts stay."""
    graph = model.graph
    rank3 = {i.name: i for i in graph.initializer if len(i.dims) == 3}
    found, kept = 0, {}
    matched: list[_Experts] = []
    nodes = Nodes(graph)
    for node in graph.node:
        if node.op_type != "If" or (pair := _stacked_pair(node, rank3)) is None:
            continue
        found += 1
        result = _match(graph, nodes, node, pair, rank3, data_dir)
        if isinstance(result, str):
            kept[result] = kept.get(result, 0) + 1
        else:
            matched.append(result)
    interleaved: dict[str, str] = {}
    reordered: list[str] = []
    for experts in matched:
        _replace(graph, nodes, experts, interleaved, data_dir, reordered)
    if matched:
        drop_dead_nodes(graph)
        import_microsoft_domain(model)
    lines = [f"experts: {count} of {found} layers {reason}" for reason, count in kept.items()]
    quantized = sum(experts.quantized is not None for experts in matched)
    return ExpertsRewrite(len(matched), found, lines, reordered, quantized)


def _stacked_pair(node: onnx.NodeProto, rank3: dict[str, onnx.TensorProto]) -> tuple[str, str] | None:
    """The (gate_up, down) initializers an ``If``'s branches read: [E, 2I, D] and [E, D, I]."""
    names = [name for name in dict.fromkeys(reads(node)) if name in rank3]
    for a in names:
        for b in names:
            (e, two_i, d), (e2, d2, i) = rank3[a].dims, rank3[b].dims
            if a != b and e == e2 and d == d2 and two_i == 2 * i:
                return a, b
    return None


def _match(graph: onnx.GraphProto, nodes: Nodes, node: onnx.NodeProto, pair: tuple[str, str],
           rank3: dict[str, onnx.TensorProto], data_dir: Path | None) -> _Experts | str:
    """The experts of ``node``, or the reason (without the layer's name) they stay in standard ops."""
    gate_up, down = pair
    quantized = any(n.op_type == "DequantizeLinear" for sub in _branches(node) for n in all_nodes(sub))
    if not quantized:
        problem = _float_stacks_problem(nodes, rank3, gate_up, down, data_dir)
        if problem is not None:
            return problem
    reasons = []
    for sub in _branches(node):
        result = _match_gather_branch(graph, nodes, sub, gate_up, down)
        if isinstance(result, str):
            reasons.append(result)
            continue
        x2, indices, weights, gate_first, stacks = result
        top_k = _top_k(graph, nodes, indices)
        if top_k is None:
            return "route through indices whose top-k count is not a constant, so MoE's k is unknown"
        if not quantized:
            dtype = rank3[gate_up].data_type
            if not _output_in(sub, dtype):
                return "write an output of another type than their weights'"
            return _Experts(node, x2, indices, weights, gate_up, down, gate_first, top_k, dtype)
        if stacks is None:
            return "have quantized weights that their gather branch does not read as Gather -> DequantizeLinear"
        if not _output_in(sub, onnx.TensorProto.FLOAT):
            return ("have quantized weights in a float16 or bfloat16 model: QMoE is written for float32 models, "
                    "whose float32 activations the parity check holds it to")
        plan = qmoe.plan(graph, nodes, *stacks, data_dir)
        if isinstance(plan, str):
            return plan
        return _Experts(node, x2, indices, weights, gate_up, down, gate_first, top_k, onnx.TensorProto.FLOAT, plan)
    return next((r for r in reasons if r), "have no gather branch of the expected pattern (docs/onnxruntime-target.md"
                                           "#experts) and stay in standard ops")


def _float_stacks_problem(nodes: Nodes, rank3: dict[str, onnx.TensorProto], gate_up: str, down: str,
                          data_dir: Path | None) -> str | None:
    """Why float stacks cannot be read by ``MoE`` (their type) or reordered for it in place; None when they can."""
    if any(rank3[name].data_type not in MOE_TYPES for name in (gate_up, down)):
        return (f"store their weights as {onnx.TensorProto.DataType.Name(rank3[gate_up].data_type)}, which ONNX "
                "Runtime's CPU MoE kernel does not take (float32, float16)")
    if data_dir is None and any(uses_external_data(rank3[name]) for name in (gate_up, down)):
        return "keep their weights in external data (load the model with its data to rewrite them)"
    if uses_external_data(rank3[gate_up]) and [r.op_type for r in nodes.consumers.get(gate_up, [])] != ["If"]:
        return "share their gate/up stack with other nodes, so it cannot be reordered for MoE in place"
    return None


def _branches(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


def _match_gather_branch(graph: onnx.GraphProto, outer: Nodes, sub: onnx.GraphProto, gate_up: str, down: str
                         ) -> tuple[str, str, str, bool, tuple[qmoe.Stack, qmoe.Stack] | None] | str:
    """``(x2, indices, weights, gate first, the quantized (gate_up, down) stacks or None)`` of a gather branch; a
    reason ("" for a branch of another form). A quantized branch dequantizes what it gathers before the
    MatMuls."""
    nodes = Nodes(sub)
    gathers = {name: [n for n in sub.node if n.op_type == "Gather" and n.input[0] == name and attr(n, "axis", 0) == 0]
               for name in (gate_up, down)}
    if len(gathers[gate_up]) != 1 or len(gathers[down]) != 1:
        return ""
    up_gather, down_gather = gathers[gate_up][0], gathers[down][0]
    indices = _outer_source(nodes, up_gather.input[1])
    if indices is None or _outer_source(nodes, down_gather.input[1]) != indices:
        return ""
    dequantized = [qmoe.dequantized_gather(sub, nodes, g) for g in (up_gather, down_gather)]
    if (dequantized[0] is None) != (dequantized[1] is None):
        return ""
    stacks = None if dequantized[0] is None else (dequantized[0][1], dequantized[1][1])
    up_weight, down_weight = ((up_gather.output[0], down_gather.output[0]) if stacks is None
                              else (dequantized[0][0], dequantized[1][0]))
    up_mm = _follow(nodes, up_weight, "MatMul")
    down_mm = _follow(nodes, down_weight, "MatMul")
    if up_mm is None or down_mm is None or _source(nodes, up_mm.input[0]) != up_weight \
            or _source(nodes, down_mm.input[0]) != down_weight:
        return ""
    x2 = _outer_source(nodes, up_mm.input[1])
    split = _follow(nodes, up_mm.output[0], "Split")
    hidden = _source(nodes, down_mm.input[1])
    if x2 is None or split is None or len(split.output) != 2 or attr(split, "axis", 0) not in (-1, 2):
        return ""
    gate_first = _swiglu(nodes, split, hidden)
    if gate_first is None:
        ops = _ops_between(nodes, split, hidden)
        return (f"compute an activation ({', '.join(ops)} between the gate/up projection and down_proj) that is not "
                "silu(gate) * up, and MoE's activation_type has no such activation (Kimi K3's SiTU)")
    weighted = _follow(nodes, down_mm.output[0], "Mul")
    if weighted is None:
        return ""
    other = weighted.input[1] if _source(nodes, weighted.input[0]) == down_mm.output[0] else weighted.input[0]
    weights = _outer_source(nodes, other)
    if weights is None or not _sums_experts(graph, outer, nodes, sub, weighted):
        return ""
    return x2, indices, weights, gate_first, stacks


def _swiglu(nodes: Nodes, split: onnx.NodeProto, hidden: str) -> bool | None:
    """Whether ``hidden = Mul(Mul(g, Sigmoid(g)), u)`` of the Split's two halves: True when the gate is the first
    half, False the second, None when ``hidden`` is anything else."""
    product = nodes.producer(hidden)
    if product is None or product.op_type != "Mul":
        return None
    for silu_name, up in (product.input, reversed(product.input)):
        silu = nodes.producer(silu_name)
        if silu is None or silu.op_type != "Mul" or up not in split.output:
            continue
        for gate, sig in (silu.input, reversed(silu.input)):
            sigmoid = nodes.producer(sig)
            if (sigmoid is not None and sigmoid.op_type == "Sigmoid" and sigmoid.input[0] == gate
                    and gate in split.output and gate != up):
                return gate == split.output[0]
    return None


def _ops_between(nodes: Nodes, split: onnx.NodeProto, hidden: str) -> list[str]:
    """The op types computing ``hidden`` from the Split, in graph order, once each."""
    seen, stack, ops = set(), [hidden], []
    while stack:
        node = nodes.producer(stack.pop())
        if node is None or id(node) in seen or node is split:
            continue
        seen.add(id(node))
        ops.append(node.op_type)
        stack.extend(node.input)
    return list(dict.fromkeys(reversed(ops)))


def _sums_experts(graph: onnx.GraphProto, outer: Nodes, nodes: Nodes, sub: onnx.GraphProto,
                  weighted: onnx.NodeProto) -> bool:
    """Whether the weighted expert outputs [N, k, D] are summed over axis 1 into the branch's only output,
    through Casts."""
    name = weighted.output[0]
    while (cast := nodes.only_consumer(name, "Cast")) is not None:
        name = cast.output[0]
    total = nodes.only_consumer(name, "ReduceSum")
    if total is None or len(total.input) < 2 or attr(total, "keepdims", 1) != 0:
        return False
    axes = constant_value(graph, outer, total.input[1])
    if axes is None:
        axes = constant_value(sub, nodes, total.input[1])
    if axes is None or [int(a) for a in axes.reshape(-1)] != [1]:
        return False
    name = total.output[0]
    while (cast := nodes.only_consumer(name, "Cast")) is not None:
        name = cast.output[0]
    return len(sub.output) == 1 and sub.output[0].name == name


def _output_in(sub: onnx.GraphProto, dtype: int) -> bool:
    """Whether the gather branch's output has type ``dtype``: a final Cast to it, or a float32 sum in a float32
    model."""
    last = next(n for n in sub.node if sub.output[0].name in n.output)
    return attr(last, "to", None) == dtype if last.op_type == "Cast" else dtype == onnx.TensorProto.FLOAT


def _follow(nodes: Nodes, name: str, op_type: str) -> onnx.NodeProto | None:
    """The ``op_type`` node reached from ``name`` through single-reader Reshapes/Unsqueezes/Squeezes."""
    while len(readers := nodes.consumers.get(name, [])) == 1:
        if readers[0].op_type == op_type:
            return readers[0]
        if readers[0].op_type not in _QUIET:
            return None
        name = readers[0].output[0]
    return None


def _source(nodes: Nodes, name: str) -> str:
    """``name`` before the Reshapes/Unsqueezes/Squeezes of the branch that produced it."""
    while (node := nodes.producer(name)) is not None and node.op_type in _QUIET:
        name = node.input[0]
    return name


def _outer_source(nodes: Nodes, name: str) -> str | None:
    """The enclosing graph's value ``name`` reshapes; None when the branch computes it."""
    name = _source(nodes, name)
    return None if nodes.producer(name) is not None else name


def _top_k(graph: onnx.GraphProto, nodes: Nodes, indices: str) -> int | None:
    """The k of ``indices`` [N, k]: a TopK's constant k, else a static dimension the graph records."""
    producer = nodes.producer(indices)
    if producer is not None and producer.op_type == "TopK" and producer.output[1] == indices:
        k = constant_value(graph, nodes, producer.input[1])
        if k is not None and k.size == 1:
            return int(k.reshape(-1)[0])
    for info in graph.value_info:
        if info.name == indices and len(info.type.tensor_type.shape.dim) == 2:
            dim = info.type.tensor_type.shape.dim[1]
            return dim.dim_value if dim.HasField("dim_value") else None
    return None


def _replace(graph: onnx.GraphProto, nodes: Nodes, experts: _Experts, interleaved: dict[str, str],
             data_dir: Path | None, reordered: list[str]) -> None:
    """Append the routing-probability construction, the MoE (QMoE) node and the rescale writing the If's output;
    remove the If."""
    if experts.quantized is not None:
        op, attributes = "QMoE", qmoe.attributes(experts.quantized)
        weights = qmoe.write(graph, experts.quantized, experts.gate_first, data_dir)
        reordered += [n for n in (experts.quantized.gate_up.values, experts.quantized.gate_up.scales,
                                  experts.quantized.gate_up.zero_points) if n]
    else:
        if experts.gate_up not in interleaved:
            interleaved[experts.gate_up] = _interleaved(graph, nodes, experts.gate_up, experts.gate_first, data_dir,
                                                        reordered)
        op, attributes, weights = "MoE", {}, [interleaved[experts.gate_up], "", experts.down]
    stacks = {i.name: i for i in graph.initializer}
    count = stacks[experts.down].dims[0]
    f32, model = onnx.TensorProto.FLOAT, experts.dtype
    p = f"{experts.node.name or experts.node.output[0]}/moe"
    tensor = numpy_helper.from_array
    new = [
        oh.make_node("Constant", [], [f"{p}/axis"], value=tensor(np.array([1], np.int64))),
        oh.make_node("Constant", [], [f"{p}/tiny"], value=tensor(np.array(TINY, np.float32))),
        oh.make_node("Constant", [], [f"{p}/experts"], value=tensor(np.array([count], np.int64))),
        oh.make_node("Cast", [experts.weights], [f"{p}/weights"], to=f32),
        oh.make_node("ReduceSum", [f"{p}/weights", f"{p}/axis"], [f"{p}/sum"], keepdims=1),
        oh.make_node("Max", [f"{p}/sum", f"{p}/tiny"], [f"{p}/sum_safe"]),
        oh.make_node("Div", [f"{p}/weights", f"{p}/sum_safe"], [f"{p}/share"]),
        oh.make_node("Max", [f"{p}/share", f"{p}/tiny"], [f"{p}/share_safe"]),
        oh.make_node("Log", [f"{p}/share_safe"], [f"{p}/log_share"]),
        oh.make_node("Shape", [experts.indices], [f"{p}/tokens"], start=0, end=1),
        oh.make_node("Concat", [f"{p}/tokens", f"{p}/experts"], [f"{p}/probs_shape"], axis=0),
        oh.make_node("ConstantOfShape", [f"{p}/probs_shape"], [f"{p}/fill"],
                     value=tensor(np.array([FILL], np.float32))),
        oh.make_node("ScatterElements", [f"{p}/fill", experts.indices, f"{p}/log_share"], [f"{p}/probs32"], axis=1),
    ]
    probs = f"{p}/probs32"
    if model != f32:
        new.append(oh.make_node("Cast", [probs], [f"{p}/probs"], to=model))
        probs = f"{p}/probs"
    moe_out = f"{p}/out"
    new.append(oh.make_node(
        op, [experts.x2, probs, *weights], [moe_out], name=f"{p}/{op}", domain=MS_DOMAIN, k=experts.top_k,
        activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
        normalize_routing_weights=1, use_sparse_mixer=0, **attributes))
    result = experts.node.output[0]
    if model == f32:
        new.append(oh.make_node("Mul", [moe_out, f"{p}/sum"], [result]))
    else:
        new += [oh.make_node("Cast", [moe_out], [f"{p}/out32"], to=f32),
                oh.make_node("Mul", [f"{p}/out32", f"{p}/sum"], [f"{p}/scaled"]),
                oh.make_node("Cast", [f"{p}/scaled"], [result], to=model)]
    graph.node.remove(experts.node)
    graph.node.extend(new)


def _interleaved(graph: onnx.GraphProto, nodes: Nodes, name: str, gate_first: bool, data_dir: Path | None,
                 reordered: list[str]) -> str:
    """The initializer ``name`` [E, 2I, D] with rows alternating gate, up (``swiglu_fusion=1``): reordered in place
    (in its external data file under ``data_dir`` when stored there; the name stays, since a one-file export's data
    file holds it) and listed in ``reordered`` when the experts ``If`` is its only reader, else a new inline copy
    ``<name>.interleaved``."""
    tensor = next(i for i in graph.initializer if i.name == name)
    if uses_external_data(tensor):
        _interleave_external(tensor, data_dir, gate_first)
        reordered.append(name)
        return name
    rows = _interleave(numpy_helper.to_array(tensor), gate_first)
    if [r.op_type for r in nodes.consumers.get(name, [])] == ["If"]:
        tensor.CopyFrom(numpy_helper.from_array(rows, name))
        reordered.append(name)
        return name
    graph.initializer.append(numpy_helper.from_array(rows, f"{name}.interleaved"))
    return f"{name}.interleaved"


def _interleave(stack: np.ndarray, gate_first: bool) -> np.ndarray:
    half = stack.shape[1] // 2
    gate, up = (stack[:, :half], stack[:, half:]) if gate_first else (stack[:, half:], stack[:, :half])
    return np.ascontiguousarray(np.stack([gate, up], axis=2).reshape(stack.shape))


def _interleave_external(tensor: onnx.TensorProto, data_dir: Path, gate_first: bool) -> None:
    """Reorder the rows of an externally stored stack where its bytes are (same size, same offset): one stack in
    memory at a time, and the file grows by nothing."""
    info = ExternalDataInfo(tensor)
    dtype = np.dtype(oh.tensor_dtype_to_np_dtype(tensor.data_type))
    count = int(np.prod(tensor.dims))
    with open(Path(data_dir) / info.location, "r+b") as file:
        file.seek(info.offset or 0)
        stack = np.frombuffer(file.read(count * dtype.itemsize), dtype).reshape(tuple(tensor.dims))
        file.seek(info.offset or 0)
        file.write(_interleave(stack, gate_first).tobytes())
