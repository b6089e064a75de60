"""``AttnResLM`` (docs/models.md#attnreslm): the reference decoder-only LM, with AttnRes (Full/Block) or standard
residuals.

One readable file: the math is visible. Every depth aggregation goes through ``attnres::aggregate`` so the
exporter sees exactly one op per aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnres_export.models.base import (
    CacheInput,
    ExportPlan,
    KeepFloat32,
    PlanAdd,
    PlanAggregate,
    PlanPiece,
    PlanStep,
    PlanValue,
    WithPastStep,
    empty_past,
    step_input_axes,
    step_output_names,
)
from attnres_export.models.config import FamilyConfig
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.models.limits import EPS, HEADS, LAYERS, MAX_LAYERS, WIDTH, Range
from attnres_export.ops.aggregate import attnres_aggregate
from attnres_export.ops.aggregate_norm import attnres_aggregate_norm
from attnres_export.ops.precision import at_least_float32

ROPE_THETA = 10000.0
RESIDUALS = ("attnres", "standard")


@dataclass(frozen=True)
class AttnResLMConfig(FamilyConfig):
    """Hyper-parameters of ``AttnResLM`` (docs/models.md#attnreslm)."""

    arch: str = "attnres-lm"
    vocab_size: int = 256
    max_seq_len: int = 512
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    residual: str = "attnres"
    block_size: int = 0
    """Sublayers per block; 0 = Full AttnRes (one block per sublayer)."""
    eps: float = 1e-6

    LEGACY: ClassVar[dict] = {"running_mean": False}
    RANGES: ClassVar[dict[str, Range]] = {
        **FamilyConfig.RANGES, "d_model": WIDTH, "n_layers": LAYERS, "n_heads": HEADS, "d_ff": WIDTH, "eps": EPS,
        "block_size": Range(0, 2 * MAX_LAYERS)}

    def problems(self) -> Iterator[str]:
        yield from super().problems()
        if self.arch != "attnres-lm":
            yield f"arch must be attnres-lm, got {self.arch!r}"
        if self.residual not in RESIDUALS:
            yield f"residual must be one of {', '.join(RESIDUALS)}, got {self.residual!r}"
        if self.n_heads >= 1 and self.d_model % self.n_heads:
            yield f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}"
        elif self.n_heads >= 1 and (self.d_model // self.n_heads) % 2:
            yield f"head size {self.d_model // self.n_heads} must be even for rotary embeddings"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_sublayers(self) -> int:
        return 2 * self.n_layers

    def describe(self) -> str:
        return f"residual {self.residual}, block size {self.block_size}"


class DepthAggregation(KeepFloat32):
    """One AttnRes aggregation: pseudo-query ``query`` and key-norm gain ``norm.weight`` (docs/op-set.md)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.query = nn.Parameter(torch.zeros(dim))
        self.norm = RMSNorm(dim, eps)
        self.register_buffer("score_weight", None, persistent=False)

    def compute_score_weight(self) -> torch.Tensor:
        """``gain * query`` folded in float32."""
        return at_least_float32(self.norm.weight) * at_least_float32(self.query)

    def fold(self) -> None:
        """Freeze ``score_weight`` into a float32 buffer, so an export holds it as one named initializer."""
        self.score_weight = self.compute_score_weight().detach().clone()

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        return attnres_aggregate(self._score_weight(), sources, self.eps)

    def normalized(self, sources: list[torch.Tensor], norm: RMSNorm) -> torch.Tensor:
        """``norm(self(sources))`` as one ``attnres::aggregate_norm`` op (the same math)."""
        return attnres_aggregate_norm(self._score_weight(), at_least_float32(norm.weight), sources, self.eps,
                                      norm.eps)

    def _score_weight(self) -> torch.Tensor:
        return self.score_weight if self.score_weight is not None else self.compute_score_weight()


class Rotary(KeepFloat32):
    """Rotary position tables ``[max_seq_len, head_dim]`` for the "rotate half" convention, float32."""

    def __init__(self, max_seq_len: int, head_dim: int) -> None:
        super().__init__()
        with torch.device("cpu"):  # computed, not loaded: real even when the model is built on "meta"
            inv_freq = ROPE_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
            angles = torch.arange(max_seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
            angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:seq_len], self.sin[:seq_len]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``[x1*cos - x2*sin, x2*cos + x1*sin]`` on ``[B, H, T, hd]``, in float32."""
    xf = at_least_float32(x)
    half = xf.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def step_tables(rotary: Rotary, attention_mask: torch.Tensor, position_ids: torch.Tensor, past_len: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rotary tables ``[B, 1, T, hd]`` of the new tokens' positions and the causal and padding mask
    ``allowed [B, 1, T, P+T]`` of one with-past step (shared by every attention layer)."""
    cos = rotary.cos[position_ids].unsqueeze(1)
    sin = rotary.sin[position_ids].unsqueeze(1)
    t, total = position_ids.shape[1], attention_mask.shape[1]
    key_pos = torch.arange(total, device=position_ids.device)
    query_pos = torch.arange(t, device=position_ids.device) + past_len
    causal = key_pos[None, :] <= query_pos[:, None]
    return cos, sin, causal[None, None] & attention_mask[:, None, None, :].bool()


class Attention(nn.Module):
    def __init__(self, cfg: AttnResLMConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

        q = apply_rotary(heads(self.wq), cos, sin)
        k = apply_rotary(heads(self.wk), cos, sin)
        v = heads(self.wv)
        # One op rather than six: the same float32 math, and an export that traces about a fifth faster
        # (docs/exporter-notes.md#export-time).
        out = F.scaled_dot_product_attention(at_least_float32(q), at_least_float32(k), at_least_float32(v),
                                             is_causal=True).to(x.dtype)
        return self.wo(out.transpose(1, 2).reshape(b, t, d))

    def forward_cached(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past_k: torch.Tensor,
                       past_v: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attention of the new tokens over ``past ++ new`` keys (docs/decode.md): returns the output and the
        present keys/values ``[B, H, P+T, hd]`` (keys after rotary). ``allowed [B, 1, T, P+T]`` is the causal and
        padding mask; disallowed scores get float32's lowest finite value, so a row with no key left gives a
        finite (uniform) result rather than NaN, and a row with any key gives exactly what ``-inf`` gives."""
        b, t, d = x.shape

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

        k = torch.cat([past_k, apply_rotary(heads(self.wk), cos, sin)], dim=2)
        v = torch.cat([past_v, heads(self.wv)], dim=2)
        q = apply_rotary(heads(self.wq), cos, sin)
        scores = (at_least_float32(q) @ at_least_float32(k).transpose(-1, -2)) * (self.head_dim**-0.5)
        probs = scores.masked_fill(~allowed, torch.finfo(torch.float32).min).softmax(dim=-1)
        out = (probs @ at_least_float32(v)).to(x.dtype)
        return self.wo(out.transpose(1, 2).reshape(b, t, d)), k, v


class SwiGLU(nn.Module):
    def __init__(self, cfg: AttnResLMConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    """One transformer layer: two sublayers (attention, MLP), each with its own PreNorm and aggregation."""

    def __init__(self, cfg: AttnResLMConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.eps)
        self.mlp = SwiGLU(cfg)
        if cfg.residual == "attnres":
            self.attn_res = DepthAggregation(cfg.d_model, cfg.eps)
            self.mlp_res = DepthAggregation(cfg.d_model, cfg.eps)


class _KVStep:
    """The KV cache of one forward step: the pasts handed in, the presents produced, layer by layer."""

    def __init__(self, past: list[torch.Tensor], allowed: torch.Tensor) -> None:
        self.past, self.allowed, self.presents = past, allowed, []

    def attend(self, fn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        i = len(self.presents)
        out, k, v = fn.forward_cached(x, cos, sin, self.past[i], self.past[i + 1], self.allowed)
        self.presents += [k, v]
        return out


class AttnResLM(nn.Module):
    """Decoder-only LM of docs/models.md#attnreslm; ``forward(input_ids [B, T]) -> logits [B, T, V]`` float32."""

    input_axes: ClassVar[dict[str, dict[int, str]]] = {"input_ids": {0: "batch", 1: "seq"}}
    output_names = ("logits",)

    def __init__(self, cfg: AttnResLMConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        if cfg.residual == "attnres":
            self.out_res = DepthAggregation(cfg.d_model, cfg.eps)
        self.norm = RMSNorm(cfg.d_model, cfg.eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.max_seq_len, cfg.head_dim)
        self.fuse_norms = False
        """Compute each aggregation and the RMSNorm that reads it as one ``attnres::aggregate_norm`` op."""

    def sublayers(self):
        """(aggregation, prenorm, function) per sublayer, in order attn_0, mlp_0, attn_1, ..."""
        for layer in self.layers:
            yield getattr(layer, "attn_res", None), layer.attn_norm, layer.attn
            yield getattr(layer, "mlp_res", None), layer.mlp_norm, layer.mlp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rotary(input_ids.shape[1])
        h = self.embed(input_ids)
        x = self._standard(h, cos, sin) if self.config.residual == "standard" else self._attnres(h, cos, sin)
        return at_least_float32(self.lm_head(x))

    def forward_with_past(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                          past: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One prefill or decode step with a KV cache (docs/decode.md).

        ``input_ids``/``position_ids`` ``[B, T]`` int64 (rotary angles follow ``position_ids``),
        ``attention_mask [B, P+T]`` int64 (1 = token, 0 = padding) over past and new tokens, ``past`` the keys and
        values of every attention layer ``[B, H, P, hd]`` in order k_0, v_0, k_1, ... (``P`` may be 0). Returns
        ``logits [B, T, V]`` float32 and the presents ``[B, H, P+T, hd]`` in the same order. AttnRes needs no
        other state: block representations live inside one forward pass, over the new tokens only."""
        cos, sin, allowed = step_tables(self.rotary, attention_mask, position_ids, past[0].shape[2])
        cache = _KVStep(past, allowed)
        h = self.embed(input_ids)
        if self.config.residual == "standard":
            x = self._standard(h, cos, sin, cache)
        else:
            x = self._attnres(h, cos, sin, cache)
        return at_least_float32(self.lm_head(x)), cache.presents

    def _run(self, fn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             cache: _KVStep | None = None) -> torch.Tensor:
        if not isinstance(fn, Attention):
            return fn(x)
        return fn(x, cos, sin) if cache is None else cache.attend(fn, x, cos, sin)

    def _standard(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: _KVStep | None = None
                  ) -> torch.Tensor:
        for _, prenorm, fn in self.sublayers():
            h = h + self._run(fn, prenorm(h), cos, sin, cache)
        return self.norm(h)

    def _attnres(self, emb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: _KVStep | None = None
                 ) -> torch.Tensor:
        """Block AttnRes (docs/models.md#block-attnres); ``block_size = 0`` is Full AttnRes (one block per sublayer).
        Returns the final normalized representation."""
        size = self.config.block_size or 1
        last = self.config.n_sublayers - 1
        blocks: list[torch.Tensor] = [emb]
        partial: torch.Tensor | None = None
        for j, (aggregation, prenorm, fn) in enumerate(self.sublayers()):
            sources = blocks if partial is None else [*blocks, partial]
            u = self._run(fn, self._normalized(aggregation, sources, prenorm), cos, sin, cache)
            partial = u if partial is None else partial + u
            if (j + 1) % size == 0 or j == last:
                blocks.append(partial)
                partial = None
        return self._normalized(self.out_res, blocks, self.norm)

    def _normalized(self, aggregation: DepthAggregation, sources: list[torch.Tensor], norm: RMSNorm) -> torch.Tensor:
        if self.fuse_norms:
            return aggregation.normalized(sources, norm)
        return norm(aggregation(sources))

    @contextmanager
    def norms_fused(self) -> Iterator[None]:
        """Inside, every aggregation and the RMSNorm after it run as one ``attnres::aggregate_norm`` op, so an
        export holds one AttnResAggregateNorm node per aggregation (docs/op-set.md#attnresaggregatenorm)."""
        self.fuse_norms = True
        try:
            yield
        finally:
            self.fuse_norms = False

    @contextmanager
    def score_weights_folded(self) -> Iterator[None]:
        """Inside, every aggregation's ``gain * query`` is frozen (for export: one float32 initializer each);
        afterwards it is computed again, so the model stays a reference that float64 reads exactly."""
        aggregations = [module for module in self.modules() if isinstance(module, DepthAggregation)]
        for module in aggregations:
            module.fold()
        try:
            yield
        finally:
            for module in aggregations:
                module.score_weight = None

    def random_inputs(self, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Token ids ``[batch, seq]`` drawn uniformly from the vocabulary."""
        return {"input_ids": rng.integers(0, self.config.vocab_size, size=(batch, seq), dtype=np.int64)}

    def aggregation_count(self) -> int:
        """Number of depth aggregations one forward pass performs (0 for standard residuals)."""
        return 0 if self.config.residual == "standard" else self.config.n_sublayers + 1

    def fused_node_count(self) -> int:
        """attnres nodes an export holds: one AttnResAggregate (or AttnResAggregateNorm) per aggregation."""
        return self.aggregation_count()

    def with_past(self) -> AttnResLMWithPast:
        return AttnResLMWithPast(self)

    def export_plan(self, with_past: bool = False, fuse_norm: bool = False) -> ExportPlan:
        """The model as the exporter assembles it (models/base.py:ExportPlan): pieces of four kinds (the embedding,
        the attention and MLP sublayers, the head) with the aggregations, or the residual adds, between them, in the
        order ``forward`` (``forward_with_past``) computes them."""
        cfg = self.config
        attnres = cfg.residual == "attnres"
        if fuse_norm and not attnres:
            raise ValueError("fuse_norm needs depth aggregations; this model has standard residuals")
        hidden = PlanValue("x", ("batch", "seq", cfg.d_model))
        ids = PlanValue("input_ids", ("batch", "seq"), "int64")
        cache = self.with_past().cache_inputs() if with_past else []
        if with_past:
            inputs = (ids, PlanValue("attention_mask", ("batch", "total"), "int64"),
                      PlanValue("position_ids", ("batch", "seq"), "int64"),
                      *(PlanValue(c.name, c.axes, c.dtype) for c in cache))
            rows: tuple[str | int, ...] = ("batch", 1, "seq", cfg.head_dim)
            embed = PlanPiece("embedding", "embed", _StepEmbeddingPiece(self),
                              ("input_ids", "attention_mask", "position_ids", cache[0].name),
                              ("embedding", "cos", "sin", "allowed"), inputs[:4])
        else:
            inputs = (ids,)
            rows = ("seq", cfg.head_dim)
            embed = PlanPiece("embedding", "embed", _EmbeddingPiece(self), ("input_ids",), ("embedding", "cos", "sin"),
                              inputs)
        tables = (PlanValue("cos", rows, "float32"), PlanValue("sin", rows, "float32"))
        mask = PlanValue("allowed", ("batch", 1, "seq", "total"), "bool")
        steps: list[PlanStep] = [embed]
        layers_cache = iter(cache)

        def sublayer(j: int, prenorm: RMSNorm, fn: nn.Module, x: str) -> str:
            name = _sublayer_name(j)
            module = _SublayerPiece(None if fuse_norm else prenorm, fn, with_past)
            if not isinstance(fn, Attention):
                steps.append(PlanPiece("mlp", name, module, (x,), (f"{name}.out",), (hidden,)))
                return f"{name}.out"
            kv = [next(layers_cache), next(layers_cache)] if with_past else []
            signature = (hidden, *tables, *(PlanValue(f"past_{i}", c.axes, c.dtype) for i, c in enumerate(kv)),
                         *((mask,) if with_past else ()))
            steps.append(PlanPiece("attention", name, module,
                                   (x, "cos", "sin", *(c.name for c in kv), *(("allowed",) if with_past else ())),
                                   (f"{name}.out", *(c.present for c in kv)), signature))
            return f"{name}.out"

        def aggregate(name: str, aggregation: DepthAggregation, sources: list[str], norm: RMSNorm) -> str:
            steps.append(PlanAggregate(
                name, tuple(sources), f"{name}.out", aggregation.compute_score_weight().detach(), aggregation.eps,
                at_least_float32(norm.weight).detach() if fuse_norm else None, norm.eps if fuse_norm else 0.0))
            return f"{name}.out"

        if attnres:
            size, last = cfg.block_size or 1, cfg.n_sublayers - 1
            blocks, partial = ["embedding"], None
            for j, (aggregation, prenorm, fn) in enumerate(self.sublayers()):
                sources = blocks if partial is None else [*blocks, partial]
                u = sublayer(j, prenorm, fn, aggregate(f"{_sublayer_name(j)}_res", aggregation, sources, prenorm))
                if partial is not None:
                    steps.append(PlanAdd(partial, u, f"{_sublayer_name(j)}.partial"))
                partial = u if partial is None else f"{_sublayer_name(j)}.partial"
                if (j + 1) % size == 0 or j == last:
                    blocks.append(partial)
                    partial = None
            head_in = aggregate("out_res", self.out_res, blocks, self.norm)
        else:
            head_in = "embedding"
            for j, (_, prenorm, fn) in enumerate(self.sublayers()):
                steps.append(PlanAdd(head_in, sublayer(j, prenorm, fn, head_in), f"{_sublayer_name(j)}.residual"))
                head_in = f"{_sublayer_name(j)}.residual"
        steps.append(PlanPiece("head", "head", _HeadPiece(None if fuse_norm else self.norm, self.lm_head),
                               (head_in,), ("logits",), (hidden,)))
        return ExportPlan(inputs, tuple(steps), ("logits", *(c.present for c in cache)))

    STATE_SIZE_KEYS: ClassVar[dict[str, tuple[str, ...]]] = {
        "embed.weight": ("vocab_size", "d_model"), "layers.0.mlp.w1.weight": ("d_ff", "d_model")}
    """State_dict entries whose shapes pin the config's sizes (config field per axis), checked before building."""
    LAYER_PREFIX: ClassVar[str] = "layers."
    """State_dict keys ``LAYER_PREFIX{i}.`` belong to layer i (the loader counts them against ``n_layers``)."""

    def init_example(self) -> None:
        """Random, non-zero pseudo-queries of std ``2/sqrt(D)``: logits are O(1), so the softmax over depth is
        neither uniform (zero queries) nor one-hot; RMSNorm gains near 1."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith(".query") or name == "query":
                    param.normal_(0.0, 2.0 / math.sqrt(self.config.d_model))
                elif name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))


def _sublayer_name(j: int) -> str:
    """``layers.{i}.attn`` / ``layers.{i}.mlp``: the module path of sublayer ``j``'s function."""
    return f"layers.{j // 2}.{'mlp' if j % 2 else 'attn'}"


class _EmbeddingPiece(nn.Module):
    """The plain graph's first piece: the token embedding and the rotary tables of positions 0..T-1."""

    def __init__(self, lm: AttnResLM) -> None:
        super().__init__()
        self.embed, self.rotary = lm.embed, lm.rotary

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cos, sin = self.rotary(input_ids.shape[1])
        return self.embed(input_ids), cos, sin


class _StepEmbeddingPiece(nn.Module):
    """The with-past graph's first piece: the token embedding, the rotary tables of the new positions and the
    mask (``past_key`` gives the past length)."""

    def __init__(self, lm: AttnResLM) -> None:
        super().__init__()
        self.embed, self.rotary = lm.embed, lm.rotary

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                past_key: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.embed(input_ids), *step_tables(self.rotary, attention_mask, position_ids, past_key.shape[2])


class _SublayerPiece(nn.Module):
    """One sublayer on its input: the prenorm (unless an AttnResAggregateNorm applied it), then the attention or
    the MLP; a cached attention also takes the past keys, values and the mask and returns the presents."""

    def __init__(self, prenorm: RMSNorm | None, fn: nn.Module, cached: bool) -> None:
        super().__init__()
        self.prenorm, self.fn, self.cached = prenorm, fn, cached

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.prenorm is not None:
            x = self.prenorm(x)
        if not isinstance(self.fn, Attention):
            return self.fn(x)
        if not self.cached:
            return self.fn(x, *extra)
        cos, sin, past_k, past_v, allowed = extra
        return self.fn.forward_cached(x, cos, sin, past_k, past_v, allowed)


class _HeadPiece(nn.Module):
    """The last piece: the final norm (unless an AttnResAggregateNorm applied it) and the LM head, float32 logits."""

    def __init__(self, norm: RMSNorm | None, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return at_least_float32(self.lm_head(x if self.norm is None else self.norm(x)))


class AttnResLMWithPast(WithPastStep):
    """``AttnResLM`` with a KV cache, for export (docs/decode.md): ``forward(input_ids, attention_mask,
    position_ids, past) -> (logits, present_k_0, present_v_0, ...)``. ``past`` is a list of tensors (k_0, v_0, ...);
    the graph names them ``past_key_values.{i}.key`` / ``.value`` and the outputs ``present.{i}.key`` / ``.value``."""

    def cache_inputs(self) -> list[CacheInput]:
        """Keys (after rotary) and values of every layer ``[batch, n_heads, past, head_dim]``."""
        cfg = self.config
        return [CacheInput(f"past_key_values.{i}.{kv}", ("batch", cfg.n_heads, "past", cfg.head_dim))
                for i in range(cfg.n_layers) for kv in ("key", "value")]

    def metadata(self) -> dict:
        cfg = self.config
        return {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "head_dim": cfg.head_dim,
                "vocab_size": cfg.vocab_size, "max_seq_len": cfg.max_seq_len}

    def past_names(self) -> list[str]:
        return [c.name for c in self.cache_inputs()]

    def input_names(self) -> list[str]:
        return list(step_input_axes(self.cache_inputs()))

    def output_names(self) -> list[str]:
        return step_output_names(self.cache_inputs())

    def input_axes(self) -> dict[str, list[str | int]]:
        """Dim names per input axis (``total`` = ``past + seq``; head axes are static)."""
        return step_input_axes(self.cache_inputs())

    def empty_past(self, batch: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        return empty_past(self.cache_inputs(), batch, dtype)
