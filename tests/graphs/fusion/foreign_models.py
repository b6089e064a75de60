"""AttnRes models written the way other codebases write them, so fusion is tested on graphs we did not design.

Each is a tiny LM (embedding, ``n_sub`` MLP sublayers, a final aggregation, an LM head) with random non-zero
pseudo-queries. ``aggregations`` is how many depth aggregations the model computes per forward pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, N_SUB = 50, 32, 4


class Mlp(nn.Module):
    """A PreNorm MLP sublayer (the sublayer itself does not matter to fusion)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(self.norm(x))))


class ForeignLM(nn.Module):
    """Embedding, sublayers and head shared by the styles below; subclasses define ``forward``."""

    aggregations = N_SUB + 1

    def __init__(self, dim: int = DIM, n_sub: int = N_SUB, vocab: int = VOCAB, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.dim, self.n_sub = dim, n_sub
        self.embed = nn.Embedding(vocab, dim)
        self.sublayers = nn.ModuleList(Mlp(dim) for _ in range(n_sub))
        self.head = nn.Linear(dim, vocab, bias=False)

    def queries(self, count: int) -> nn.Parameter:
        return nn.Parameter(torch.randn(count, self.dim) * 0.5)


class StackEinsumLM(ForeignLM):
    """(a) Full AttnRes: a Python list of sources, ``torch.stack`` on dim 0, rsqrt RMSNorm with a gain, einsum."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.query = self.queries(self.n_sub + 1)
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(self.n_sub + 1, self.dim))
        self.eps = 1e-6

    def aggregate(self, sources: list[torch.Tensor], i: int) -> torch.Tensor:
        values = torch.stack(sources, dim=0)
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain[i]
        weights = torch.einsum("nbtd,d->nbt", keys, self.query[i]).softmax(dim=0)
        return torch.einsum("nbt,nbtd->btd", weights, values)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        sources = [self.embed(input_ids)]
        for i, layer in enumerate(self.sublayers):
            sources.append(layer(self.aggregate(sources, i)))
        return self.head(self.aggregate(sources, self.n_sub))


class BufferBlockLM(ForeignLM):
    """(b) Block AttnRes (S = 2) over a pre-allocated ``[n, B, T, D]`` buffer; weightless RMSNorm; float32 casts."""

    aggregations = N_SUB + 1
    block = 2

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.query = self.queries(self.n_sub + 1)
        self.eps = 1e-5

    def aggregate(self, values: torch.Tensor, i: int) -> torch.Tensor:
        v = values.float()
        norm = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + self.eps)
        weights = (norm * self.query[i].float()).sum(-1).softmax(dim=0)
        return (weights.unsqueeze(-1) * v).sum(0).to(values.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self.embed(input_ids)
        n_blocks = 1 + math.ceil(self.n_sub / self.block)
        buffer = emb.new_zeros((n_blocks + 1, *emb.shape))
        buffer[0] = emb
        done, partial = 1, None
        for j, layer in enumerate(self.sublayers):
            if partial is None:
                h = self.aggregate(buffer[:done], j)
            else:
                buffer[done] = partial
                h = self.aggregate(buffer[: done + 1], j)
            out = layer(h)
            partial = out if partial is None else partial + out
            if (j + 1) % self.block == 0 or j == self.n_sub - 1:
                buffer[done] = partial
                done, partial = done + 1, None
        return self.head(self.aggregate(buffer[:done], self.n_sub))


class TokenMajorLM(ForeignLM):
    """(c) Full AttnRes with token-major ``[B*T, n, D]`` sources, ``Linear(d, 1)`` scorers holding ``g * w``,
    a constant logit scale and a batched matmul for the weighted sum."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.scorers = nn.ModuleList(nn.Linear(self.dim, 1, bias=False) for _ in range(self.n_sub + 1))
        for scorer in self.scorers:
            nn.init.normal_(scorer.weight, std=1.0)
        self.scale = 0.7
        self.eps = 1e-6

    def aggregate(self, sources: list[torch.Tensor], i: int) -> torch.Tensor:
        b, t, d = sources[0].shape
        values = torch.stack(sources, dim=2).reshape(b * t, len(sources), d)
        normed = values * (values.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt()
        weights = (self.scorers[i](normed) * self.scale).softmax(dim=1)
        return torch.bmm(weights.transpose(1, 2), values).reshape(b, t, d)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        sources = [self.embed(input_ids)]
        for i, layer in enumerate(self.sublayers):
            sources.append(layer(self.aggregate(sources, i)))
        return self.head(self.aggregate(sources, self.n_sub))


class TorchRMSNormLM(ForeignLM):
    """(d) Block AttnRes (S = 2) with ``nn.RMSNorm`` key norms; sources scored one by one and kept separate."""

    block = 2

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.query = self.queries(self.n_sub + 1)
        self.norms = nn.ModuleList(nn.RMSNorm(self.dim, eps=1e-6) for _ in range(self.n_sub + 1))
        for norm in self.norms:
            nn.init.normal_(norm.weight, mean=1.0, std=0.1)

    def aggregate(self, sources: list[torch.Tensor], i: int) -> torch.Tensor:
        scores = torch.stack([self.norms[i](v) @ self.query[i] for v in sources], dim=-1)
        weights = scores.softmax(dim=-1)
        return sum(weights[..., k : k + 1] * v for k, v in enumerate(sources))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        blocks, partial = [self.embed(input_ids)], None
        for j, layer in enumerate(self.sublayers):
            h = self.aggregate(blocks if partial is None else [*blocks, partial], j)
            out = layer(h)
            partial = out if partial is None else partial + out
            if (j + 1) % self.block == 0 or j == self.n_sub - 1:
                blocks.append(partial)
                partial = None
        return self.head(self.aggregate(blocks, self.n_sub))


class RepeatedSourceLM(StackEinsumLM):
    """(e) Like (a), but the first aggregation stacks the embedding twice ([emb, emb]), as some code does to give
    the first sublayer two candidates."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self.embed(input_ids)
        sources = [emb]
        for i, layer in enumerate(self.sublayers):
            sources.append(layer(self.aggregate([emb, emb] if i == 0 else sources, i)))
        return self.head(self.aggregate(sources, self.n_sub))


class HandSoftmaxLM(StackEinsumLM):
    """(f) Like (a), with the softmax over depth written out: exp(logits - max) / sum(exp(logits - max))."""

    def aggregate(self, sources: list[torch.Tensor], i: int) -> torch.Tensor:
        values = torch.stack(sources, dim=0)
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain[i]
        logits = torch.einsum("nbtd,d->nbt", keys, self.query[i])
        weights = torch.exp(logits - logits.amax(dim=0, keepdim=True))
        weights = weights / weights.sum(dim=0, keepdim=True)
        return torch.einsum("nbt,nbtd->btd", weights, values)


class TwoPhaseLseLM(ForeignLM):
    """(g) Block AttnRes (S = 2) in two phases (docs/models.md#two-phase-inference): per block, phase 1 gives each
    query of the block the softmax mix ``o`` of the completed blocks and its ``logsumexp``; phase 2 merges the
    partial sum through ``m = max(lse, s2)`` and ``exp(. - m)`` weights."""

    block = 2

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.query = self.queries(self.n_sub + 1)
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(self.n_sub + 1, self.dim))
        self.eps = 1e-6

    def logits(self, values: torch.Tensor, i: int) -> torch.Tensor:
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain[i]
        return keys @ self.query[i]

    def phase1(self, blocks: list[torch.Tensor], i: int) -> tuple[torch.Tensor, torch.Tensor]:
        stacked = torch.stack(blocks)
        logits = self.logits(stacked, i)
        return torch.einsum("nbt,nbtd->btd", logits.softmax(0), stacked), torch.logsumexp(logits, 0)

    def merge(self, mixed: tuple[torch.Tensor, torch.Tensor], partial: torch.Tensor, i: int) -> torch.Tensor:
        o, lse = mixed
        s2 = self.logits(partial, i)
        m = torch.maximum(lse, s2)
        w1, w2 = torch.exp(lse - m).unsqueeze(-1), torch.exp(s2 - m).unsqueeze(-1)
        return (w1 * o + w2 * partial) / (w1 + w2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        blocks = [self.embed(input_ids)]
        for start in range(0, self.n_sub, self.block):
            layers = range(start, min(start + self.block, self.n_sub))
            mixed = [self.phase1(blocks, j) for j in layers]
            partial = None
            for j, phase1 in zip(layers, mixed, strict=True):
                h = phase1[0] if partial is None else self.merge(phase1, partial, j)
                out = self.sublayers[j](h)
                partial = out if partial is None else partial + out
            blocks.append(partial)
        return self.head(self.phase1(blocks, self.n_sub)[0])


class TwoPhaseSigmoidLM(TwoPhaseLseLM):
    """(h) Like (g), with the merge of attnres_export/ops/two_phase.py: ``o + sigmoid(s2 - lse) * (p - o)``."""

    def merge(self, mixed: tuple[torch.Tensor, torch.Tensor], partial: torch.Tensor, i: int) -> torch.Tensor:
        o, lse = mixed
        gate = torch.sigmoid(self.logits(partial, i) - lse).unsqueeze(-1)
        return o + gate * (partial - o)


class TwoPhaseRunningLM(TwoPhaseLseLM):
    """(i) Like (g), with phase 1 written by hand as an online softmax: running max ``m``, sum ``l`` and the
    normalized mix, merged with the partial as ``(exp(m1-m)*l1*o1 + exp(s2-m)*p) / (exp(m1-m)*l1 + exp(s2-m))``."""

    def phase1(self, blocks: list[torch.Tensor], i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stacked = torch.stack(blocks)
        logits = self.logits(stacked, i)
        m1 = logits.amax(0)
        e = torch.exp(logits - m1)
        l1 = e.sum(0)
        return (e.unsqueeze(-1) * stacked).sum(0) / l1.unsqueeze(-1), m1, l1

    def merge(self, mixed: tuple[torch.Tensor, ...], partial: torch.Tensor, i: int) -> torch.Tensor:
        o1, m1, l1 = mixed
        s2 = self.logits(partial, i)
        m = torch.maximum(m1, s2)
        a, b = (torch.exp(m1 - m) * l1).unsqueeze(-1), torch.exp(s2 - m).unsqueeze(-1)
        return (a * o1 + b * partial) / (a + b)


class InPlaceBankLM(ForeignLM):
    """(l) Full AttnRes in the style of serving engines (SGLang's ``attn_residual.py``): a bank of sources
    preallocated once as a buffer ``[max_tokens, n, D]``, a view of it per forward (``bank[: b * t]``) written in
    place, the embedding by slice assignment and each sublayer output with ``bank[:, i, :].copy_(x)``; each
    aggregation reads ``bank[:, : i + 1]`` token-major. Exported, the writes are ScatterElements into the view and
    ScatterND of the view back into the bank."""

    max_tokens = 512
    """Batch 8 x sequence 64, the largest shape the tests' dynamic dims allow."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.query = self.queries(self.n_sub + 1)
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(self.n_sub + 1, self.dim))
        self.eps = 1e-6
        self.register_buffer("bank", torch.zeros(self.max_tokens, self.n_sub + 1, self.dim), persistent=False)

    def aggregate(self, values: torch.Tensor, i: int) -> torch.Tensor:
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain[i]
        weights = (keys @ self.query[i]).softmax(dim=-1)
        return torch.einsum("nk,nkd->nd", weights, values)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self.embed(input_ids)
        b, t, d = emb.shape
        bank = self.bank[: b * t]
        bank[:, 0:1, :] = emb.reshape(b * t, 1, d)
        for i, layer in enumerate(self.sublayers):
            h = self.aggregate(bank[:, : i + 1, :], i).reshape(b, t, d)
            bank[:, i + 1, :].copy_(layer(h).reshape(b * t, d))
        return self.head(self.aggregate(bank, self.n_sub).reshape(b, t, d))


class TwoPhaseOnlineLM(TwoPhaseLseLM):
    """(m) Like (g) over 8 sublayers in blocks of 4, with phase 1 kept unnormalized as an online softmax state
    ``(sum(exp(x - m1) * v), m1, sum(exp(x - m1)))``, run for every query of a block before its sublayers; each
    merge with the partial updates that state and divides once, so the only normalized result is the merged one
    (and, at a block's first sublayer, ``acc / l1``)."""

    block = 4
    aggregations = 9

    def __init__(self, **kw) -> None:
        super().__init__(n_sub=8, **kw)

    def phase1(self, blocks: list[torch.Tensor], i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stacked = torch.stack(blocks)
        logits = self.logits(stacked, i)
        m1 = logits.amax(0)
        e = torch.exp(logits - m1)
        return (e.unsqueeze(-1) * stacked).sum(0), m1, e.sum(0)

    def merge(self, state: tuple[torch.Tensor, ...], partial: torch.Tensor, i: int) -> torch.Tensor:
        acc, m1, l1 = state
        s2 = self.logits(partial, i)
        m = torch.maximum(m1, s2)
        a, b = torch.exp(m1 - m), torch.exp(s2 - m)
        return (a.unsqueeze(-1) * acc + b.unsqueeze(-1) * partial) / (a * l1 + b).unsqueeze(-1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        blocks = [self.embed(input_ids)]
        for start in range(0, self.n_sub, self.block):
            layers = range(start, min(start + self.block, self.n_sub))
            states = [self.phase1(blocks, j) for j in layers]
            partial = None
            for j, (acc, m1, l1) in zip(layers, states, strict=True):
                h = acc / l1.unsqueeze(-1) if partial is None else self.merge((acc, m1, l1), partial, j)
                out = self.sublayers[j](h)
                partial = out if partial is None else partial + out
            blocks.append(partial)
        acc, _, l1 = self.phase1(blocks, self.n_sub)
        return self.head(acc / l1.unsqueeze(-1))


class TwoPhaseRunningLongBlockLM(TwoPhaseRunningLM):
    """(i) over 8 sublayers in blocks of 4: each phase 1 runs before the block's sublayers, so the last merge of a
    block comes many nodes after its phase 1."""

    block = 4
    aggregations = 9

    def __init__(self, **kw) -> None:
        super().__init__(n_sub=8, **kw)


class PaperTwoPhaseLM(ForeignLM):
    """(n) Block AttnRes over 8 sublayers in blocks of 4, in the two-phase inference of the AttnRes paper's Algorithm 1
    with its online softmax written by hand: one ``attn_with_stats`` (queries ``[S, D]`` over values ``[N, B, T, D]``,
    giving per query the unnormalized mix, the max and the sum of exponentials) serves the batched inter-block pass of
    all queries of a block over the completed blocks, and per sublayer the one-key pass over the block's partial; the
    two are merged online, ``(e^(m1-m) o1 + e^(m2-m) o2) / (e^(m1-m) l1 + e^(m2-m) l2)``, and a block's first sublayer
    takes ``o1 / l1``. RMS-normalized keys without a gain."""

    block = 4
    aggregations = 9

    def __init__(self, **kw) -> None:
        super().__init__(n_sub=8, **kw)
        self.query = self.queries(self.n_sub + 1)
        self.eps = 1e-6

    def attn_with_stats(self, queries: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps)
        logits = torch.einsum("sd,nbtd->snbt", queries, keys)
        m = logits.amax(dim=1)
        p = torch.exp(logits - m.unsqueeze(1))
        return torch.einsum("snbt,nbtd->sbtd", p, values), m, p.sum(dim=1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        blocks = [self.embed(input_ids)]
        for start in range(0, self.n_sub, self.block):
            layers = range(start, min(start + self.block, self.n_sub))
            o1, m1, l1 = self.attn_with_stats(self.query[layers[0]: layers[-1] + 1], torch.stack(blocks))
            partial = None
            for i, j in enumerate(layers):
                if partial is None:
                    h = o1[i] / l1[i].unsqueeze(-1)
                else:
                    o2, m2, l2 = self.attn_with_stats(self.query[j: j + 1], partial.unsqueeze(0))
                    m = torch.maximum(m1[i], m2[0])
                    a, b = torch.exp(m1[i] - m), torch.exp(m2[0] - m)
                    h = (a.unsqueeze(-1) * o1[i] + b.unsqueeze(-1) * o2[0]) / (a * l1[i] + b * l2[0]).unsqueeze(-1)
                out = self.sublayers[j](h)
                partial = out if partial is None else partial + out
            blocks.append(partial)
        o, _, total = self.attn_with_stats(self.query[self.n_sub:], torch.stack(blocks))
        return self.head(o[0] / total[0].unsqueeze(-1))


class _PartialBlocks:
    """Block AttnRes that starts every block with ``partial = self.fill(x)`` and always aggregates
    ``[*blocks, partial]``: in a static-shape export the first partial of each block is a constant."""

    fill = staticmethod(torch.zeros_like)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self.embed(input_ids)
        blocks, partial = [emb], self.fill(emb)
        for j, layer in enumerate(self.sublayers):
            partial = partial + layer(self.aggregate([*blocks, partial], j))
            if (j + 1) % self.block == 0 or j == self.n_sub - 1:
                blocks.append(partial)
                partial = self.fill(emb)
        return self.head(self.aggregate(blocks, self.n_sub))


class ZerosPartialLM(_PartialBlocks, StackEinsumLM):
    """(j) Block AttnRes (S = 2) over (a)'s aggregation, each block starting with ``torch.zeros_like``."""

    block = 2


class OnesPartialLM(ZerosPartialLM):
    """(j) with ``torch.ones_like`` instead: a constant source that is not zero, which fusion does not take."""

    aggregations = 3
    """The two sites with the constant source (the first sublayer of each block) stay unfused."""
    fill = staticmethod(torch.ones_like)


class TinyEpsZerosPartialLM(ZerosPartialLM):
    """(j) with an RMS eps of 1e-8, which torch.onnx.export's optimizer drops: its graph divides the zero partial by
    0."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.eps = 1e-8


class RMSNormSublayersLM(StackEinsumLM):
    """(a) over 2 sublayers whose pre-norms are ``nn.RMSNorm`` with eps 1e-8, which torch.onnx.export's optimizer
    drops (the aggregations keep their eps of 1e-6)."""

    aggregations = 3

    def __init__(self, **kw) -> None:
        super().__init__(n_sub=2, **kw)
        for layer in self.sublayers:
            layer.norm = nn.RMSNorm(self.dim, eps=1e-8)


class ZerosPartialScoredLM(_PartialBlocks, TorchRMSNormLM):
    """(k) Like (d), but every block starts with ``partial = torch.zeros_like(x)``, which is always a source:
    a static export folds the zero source and its score (RMSNorm of zeros, dot with the query) to constants."""


class _NegativeLM(StackEinsumLM):
    """Like (a), but each aggregation is changed so that it is not AttnRes; nothing may be fused."""

    aggregations = 0


class TwoPhaseUnscaledMergeLM(TwoPhaseRunningLM):
    """(i) with a common bug: the merge drops the phase-1 sum ``l1`` (``exp(m1 - m)`` alone weighs ``o1``). Exact
    only over one completed block (``l1 = 1``); over more, the merge is no AttnRes aggregation."""

    def merge(self, mixed: tuple[torch.Tensor, ...], partial: torch.Tensor, i: int) -> torch.Tensor:
        o1, m1, _ = mixed
        s2 = self.logits(partial, i)
        m = torch.maximum(m1, s2)
        a, b = torch.exp(m1 - m).unsqueeze(-1), torch.exp(s2 - m).unsqueeze(-1)
        return (a * o1 + b * partial) / (a + b)


class SoftmaxOverTokensLM(_NegativeLM):
    """The softmax runs over the token axis instead of the source axis."""

    def aggregate(self, sources: list[torch.Tensor], i: int) -> torch.Tensor:
        values = torch.stack(sources, dim=0)
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain[i]
        weights = torch.einsum("nbtd,d->nbt", keys, self.query[i]).softmax(dim=2)
        return torch.einsum("nbt,nbtd->btd", weights, values)


class InputQueryLM(_NegativeLM):
    """The query depends on the input (the mean embedding of the sequence), so it cannot be folded."""

    def aggregate_with(self, sources: list[torch.Tensor], query: torch.Tensor) -> torch.Tensor:
        values = torch.stack(sources, dim=0)
        keys = values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + self.eps)
        weights = (keys * query).sum(-1).softmax(dim=0)
        return (weights.unsqueeze(-1) * values).sum(0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        sources = [self.embed(input_ids)]
        query = sources[0].mean(dim=1, keepdim=True)
        for layer in self.sublayers:
            sources.append(layer(self.aggregate_with(sources, query)))
        return self.head(self.aggregate_with(sources, query))


class NoNormLM(_NegativeLM):
    """The keys are not normalized: plain dot products with the query."""

    def aggregate(self, sources: list[torch.Tensor], i: int) -> torch.Tensor:
        values = torch.stack(sources, dim=0)
        weights = torch.einsum("nbtd,d->nbt", values, self.query[i] * 0.2).softmax(dim=0)
        return torch.einsum("nbt,nbtd->btd", weights, values)


POSITIVE = {"stack-einsum": StackEinsumLM, "buffer-block": BufferBlockLM, "token-major": TokenMajorLM,
            "torch-rmsnorm": TorchRMSNormLM, "repeated-source": RepeatedSourceLM,
            "hand-softmax": HandSoftmaxLM, "two-phase-lse": TwoPhaseLseLM, "two-phase-sigmoid": TwoPhaseSigmoidLM,
            "two-phase-running": TwoPhaseRunningLM, "in-place-bank": InPlaceBankLM,
            "two-phase-online": TwoPhaseOnlineLM, "paper-two-phase": PaperTwoPhaseLM}
STATIC = {"zeros-partial-stack": ZerosPartialLM, "zeros-partial-scored": ZerosPartialScoredLM}
"""Models whose zero partial sources fold to constants when exported with static shapes."""
NEGATIVE = {"softmax-over-tokens": SoftmaxOverTokensLM, "input-query": InputQueryLM, "no-norm": NoNormLM}


def example_ids(batch: int = 2, seq: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
