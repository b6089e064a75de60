"""The ``onnxruntime`` target (docs/onnxruntime-target.md): a graph's attention, experts, Kimi Delta Attention and
norms as ONNX Runtime's own ``com.microsoft`` fused ops, one module per rewrite; what no op computes the same way
stays in standard ops, and the conversion says so in one line per kind.

The AttnRes aggregations (``AttnResAggregate``, ``AttnResAggregateNorm``) and RealFormer's
``ResidualScoreAttention`` have no ONNX Runtime op: they are written as their standard-op decomposition (the
``portable`` one, recorded so ``attnres convert`` can fuse them again), which every ONNX Runtime build and
onnxruntime-genai run without a custom-op library.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from attnres_export.graphs.metadata import export_info
from attnres_export.graphs.onnx_utils import metadata, set_metadata
from attnres_export.graphs.onnxruntime_ops.nodes import MS_DOMAIN, all_nodes
from attnres_export.models.base import PAST_PREFIX

ONNX_RUNTIME_OPS_KEY = "attnres.onnxruntime_ops"
"""Model metadata of an ``onnxruntime``-target graph: ``{"nodes": {op type: count}, "kept": [line, ...]}``."""


@dataclass
class OnnxRuntimeOps:
    """What the conversion wrote: ``nodes`` per ``com.microsoft`` op type, and one line per kind of computation
    left in standard ops, with the reason."""

    nodes: dict[str, int] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    attention_layers: int = 0
    """Layers with a key/value cache, all of whose attention is GroupQueryAttention when equal to ``nodes``'."""
    reordered: list[str] = field(default_factory=list)
    """Initializers reordered for an op (the experts' gate/up rows): they keep their name but no longer hold that
    state_dict tensor, so ``decode/identity.py`` does not compare them."""

    def to_json(self) -> str:
        return json.dumps({"nodes": self.nodes, "kept": self.kept, "attention_layers": self.attention_layers,
                           "reordered": self.reordered})

    @classmethod
    def of(cls, model: onnx.ModelProto) -> OnnxRuntimeOps | None:
        """The record of an ``onnxruntime``-target graph; None for a graph of another target."""
        raw = metadata(model).get(ONNX_RUNTIME_OPS_KEY)
        if raw is None:
            return None
        data = json.loads(raw)
        return cls(dict(data.get("nodes", {})), list(data.get("kept", [])), int(data.get("attention_layers", 0)),
                   list(data.get("reordered", [])))


def to_onnxruntime(model: onnx.ModelProto, decompose: Callable[[onnx.ModelProto], None],
                   data_dir: Path | None = None) -> OnnxRuntimeOps:
    """Rewrite ``model`` (fused attnres nodes, as the ``tensorrt`` target writes them) in place for ONNX Runtime:
    Kimi Delta Attention first (it needs the fused node), then ``decompose`` for the attnres nodes left, then the
    standard-op patterns. ``data_dir``: the folder of external data files the experts rewrite may reorder in place
    (an export's staging folder). Records and returns what was written."""
    from attnres_export.graphs.onnxruntime_ops.attention import causal_group_query_attention, group_query_attention
    from attnres_export.graphs.onnxruntime_ops.experts import mixture_of_experts
    from attnres_export.graphs.onnxruntime_ops.kda import causal_convolutions, linear_attention
    from attnres_export.graphs.onnxruntime_ops.norms import simplified_layer_norms, skip_layer_norms
    from attnres_export.graphs.onnxruntime_ops.packed_qkv import packed_qkv
    from attnres_export.graphs.onnxruntime_ops.rotary import rotary_embeddings

    ops = OnnxRuntimeOps()
    ops.nodes["LinearAttention"] = linear_attention(model)
    decompose(model)
    ops.nodes["CausalConvWithState"] = causal_convolutions(model)
    experts = mixture_of_experts(model, data_dir)
    ops.nodes["MoE"] = experts.rewritten - experts.quantized
    ops.nodes["QMoE"] = experts.quantized
    ops.kept += experts.kept
    ops.reordered += experts.reordered
    rotary_embeddings(model, _max_positions(model), data_dir=data_dir)  # before attention, which moves it
    layers = _cached_attention_layers(model)
    ops.attention_layers = len(layers)
    plain = not any(v.name.startswith(PAST_PREFIX) for v in model.graph.input)
    heads, head_size = _attention_heads(model), _head_size(model)
    if (layers or plain) and heads is None:
        ops.kept.append("attention: the export records no head count, so it stays in standard ops")
    elif (layers or plain) and (head_size is None or head_size % 8):
        ops.kept.append(f"attention: heads of {head_size or 'unknown'} values stay in standard ops "
                        "(ONNX Runtime's GroupQueryAttention needs a head size that is a multiple of 8)")
    elif layers:
        ops.nodes["GroupQueryAttention"] = group_query_attention(model, *heads).layers
        if ops.nodes["GroupQueryAttention"] < len(layers):
            ops.kept.append(f"attention: {len(layers) - ops.nodes['GroupQueryAttention']} of {len(layers)} cached "
                            "layers do not match GroupQueryAttention's pattern (written another way than the "
                            "exporter writes attention) and stay in standard ops")
    elif plain:
        ops.nodes["GroupQueryAttention"] = causal_group_query_attention(model, *heads)
        if not ops.nodes["GroupQueryAttention"]:
            ops.kept.append("attention: this graph without past spells its attention another way than "
                            "GroupQueryAttention's pattern (or reads an attention_mask) and keeps it in standard ops")
    if ops.nodes.get("GroupQueryAttention"):
        packed_qkv(model)
    latent = _latent_attention_layers(model)
    if latent:
        ops.kept.append(f"attention: {len(latent)} latent-attention layer(s) stay in standard ops "
                        "(GroupQueryAttention reads cached keys and values, these layers cache a compressed latent)")
    ops.nodes["SimplifiedLayerNormalization"] = simplified_layer_norms(model)
    ops.nodes["SkipSimplifiedLayerNormalization"] = skip_layer_norms(model)
    ops.nodes["SimplifiedLayerNormalization"] -= ops.nodes["SkipSimplifiedLayerNormalization"]
    written = collections.Counter(n.op_type for n in all_nodes(model.graph) if n.domain == MS_DOMAIN)
    ops.nodes["RotaryEmbedding"] = written["RotaryEmbedding"]  # those GroupQueryAttention does not rotate inside
    ops.nodes["MatMulNBits"] = written["MatMulNBits"]
    ops.nodes = {op: count for op, count in ops.nodes.items() if count}
    set_metadata(model, ONNX_RUNTIME_OPS_KEY, ops.to_json())
    return ops


def _cached_attention_layers(model: onnx.ModelProto) -> list[str]:
    """Layers whose cache is keys and values (``past_key_values.i.key``/``.value``)."""
    names = {v.name for v in model.graph.input}
    return sorted({n.split(".")[1] for n in names if n.startswith(PAST_PREFIX) and n.endswith(".key")
                   and n.removesuffix(".key") + ".value" in names}, key=int)


def _latent_attention_layers(model: onnx.ModelProto) -> list[str]:
    """Layers whose cache is a compressed latent (``past_key_values.i.latent``: DeepSeek-V3's and Kimi's MLA)."""
    return [v.name.split(".")[1] for v in model.graph.input
            if v.name.startswith(PAST_PREFIX) and v.name.endswith(".latent")]


def _config(info: dict) -> dict:
    """The model config the export recorded (``{}`` when there is none)."""
    return info.get("config", {}) if isinstance(info.get("config"), dict) else {}


def _key_cache(model: onnx.ModelProto) -> onnx.ValueInfoProto | None:
    """The first cached-keys input ``past_key_values.i.key``, declared ``[batch, kv_heads, past, head]``."""
    return next((v for v in model.graph.input if v.name.startswith(PAST_PREFIX) and v.name.endswith(".key")), None)


def _head_size(model: onnx.ModelProto) -> int | None:
    """The attention head size: the cache's last declared dim, else the config's ``head_dim`` (or width / heads)."""
    cache = _key_cache(model)
    if cache is not None:
        dims = cache.type.tensor_type.shape.dim
        return dims[-1].dim_value or None if dims else None
    config = _config(export_info(model))
    if isinstance(config.get("head_dim"), int):
        return config["head_dim"]
    width, heads = config.get("hidden_size", config.get("d_model")), config.get("num_attention_heads",
                                                                               config.get("n_heads"))
    return width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None


def _max_positions(model: onnx.ModelProto) -> int:
    """Rows of the rotary tables: the model's longest sequence (its config's), or the export's largest past plus
    new tokens when that is longer."""
    info = export_info(model)
    config = _config(info)
    dims = info.get("dims", {}) if isinstance(info.get("dims"), dict) else {}
    exported = sum(int(dims[name][-1]) for name in ("seq", "past") if isinstance(dims.get(name), list))
    longest = [info.get("max_seq_len"), config.get("max_seq_len"), config.get("max_position_embeddings"), exported]
    return max((v for v in longest if isinstance(v, int) and v > 0), default=1)


def _attention_heads(model: onnx.ModelProto) -> tuple[int, int] | None:
    """``(query heads, key/value heads)`` from the export metadata (the with-past form's record, else the model's
    config), the key/value heads checked against the first cache input's declared ``[batch, kv_heads, past,
    head]``."""
    info = export_info(model)
    config = _config(info)
    heads = info.get("num_attention_heads", info.get("n_heads", config.get("num_attention_heads",
                                                                            config.get("n_heads"))))
    kv_heads = info.get("num_key_value_heads", config.get("num_key_value_heads", heads))
    cache = _key_cache(model)
    dims = cache.type.tensor_type.shape.dim if cache is not None else []
    if cache is not None and (len(dims) != 4 or dims[1].dim_value != kv_heads):
        return None
    if not (isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads <= heads and heads % kv_heads == 0):
        return None
    return heads, kv_heads
