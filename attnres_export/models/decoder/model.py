"""``DecoderLM`` (docs/models.md#decoderlm): Llama, Qwen2, Qwen3, Qwen3-MoE and DeepSeek-V3 bodies with
transformers' semantics and module names, with standard residuals or Kimi K3's Attention Residuals.

The module tree is named as transformers names the weights (``model.embed_tokens``,
``model.layers.{i}.self_attn.q_proj``, ..., ``model.norm``, ``lm_head``), so a folder's safetensors load
without renaming. ``forward(input_ids [B, T]) -> logits [B, T, V]`` float32; ``with_past()`` gives the
KV-cache step (``decoder/with_past.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from attnres_export.models.base import ExportPlan
from attnres_export.models.decoder.attention import GroupedQueryAttention, LatentAttention
from attnres_export.models.decoder.config import DecoderConfig
from attnres_export.models.decoder.mlp import feed_forward
from attnres_export.models.decoder.rope import RotaryEmbedding
from attnres_export.models.decoder.with_past import DecoderLMWithPast
from attnres_export.models.layers.causal_lm import CausalLM
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.models.layers.residual import ResidualNorm, ResidualProjection
from attnres_export.ops.precision import at_least_float32


class DecoderLayer(nn.Module):
    """One decoder layer: attention and feed-forward sublayers, each behind its PreNorm; with AttnRes also the
    two K3 aggregation sites (``self_attention_res_*`` before attention, ``mlp_res_*`` before the MLP)."""

    def __init__(self, cfg: DecoderConfig, index: int) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = LatentAttention(cfg) if cfg.mla is not None else GroupedQueryAttention(cfg)
        self.mlp = feed_forward(cfg, index)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        if cfg.attn_res:
            self.self_attention_res_norm = ResidualNorm(d, eps)
            self.self_attention_res_proj = ResidualProjection(d)
            self.mlp_res_norm = ResidualNorm(d, eps)
            self.mlp_res_proj = ResidualProjection(d)


class DecoderBody(nn.Module):
    """``model.``: embeddings, layers, the final norm (and with AttnRes the output aggregation site)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        if cfg.attn_res:
            self.output_attn_res_norm = ResidualNorm(d, cfg.rms_norm_eps)
            self.output_attn_res_proj = ResidualProjection(d)
        rotary_dim = cfg.mla.qk_rope_head_dim if cfg.mla is not None else cfg.head_dim
        self.rotary_emb = RotaryEmbedding(cfg.rope, rotary_dim)


class CacheStep:
    """The cached state of one forward step: the pasts handed in (two tensors per layer), the presents made."""

    def __init__(self, past: list[torch.Tensor]) -> None:
        self.past, self.presents = past, []

    def layer_past(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = len(self.presents)
        return self.past[i], self.past[i + 1]


class DecoderLM(CausalLM):
    """A decoder LM of docs/models.md#decoderlm; ``forward(input_ids [B, T]) -> logits [B, T, V]`` float32. The
    residual streams, ``init_example`` and the contract methods are ``layers/causal_lm.py``'s."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__(cfg, DecoderBody(cfg))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            self.register_load_state_dict_post_hook(_tie_again)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)[None]
        causal = positions[0][None, :] <= positions[0][:, None]
        return self._logits(input_ids, positions, causal[None, None], None)

    def forward_with_past(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                          past: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One prefill or decode step (docs/decode.md#decoderlm-with-past): ``input_ids``/``position_ids``
        ``[B, T]``, ``attention_mask [B, P+T]`` (1 = token, 0 = padding) over past and new tokens, ``past`` two
        tensors per layer in ``cache_inputs()`` order (``P`` may be 0). A new token at index ``t`` attends cache
        position ``j`` when ``j <= P + t`` and ``attention_mask[j] = 1``; rotary angles follow ``position_ids``.
        Returns ``logits [B, T, V]`` float32 and the presents (the pasts grown by ``T``)."""
        t, total = input_ids.shape[1], attention_mask.shape[1]
        past_len = past[0].shape[2] if self.config.mla is None else past[0].shape[1]
        key_pos = torch.arange(total, device=input_ids.device)
        query_pos = torch.arange(t, device=input_ids.device) + past_len
        allowed = (key_pos[None, :] <= query_pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
        cache = CacheStep(past)
        return self._logits(input_ids, position_ids, allowed, cache), cache.presents

    def with_past(self) -> DecoderLMWithPast:
        """The KV-cache form (shares these weights): ``decoder/with_past.py``."""
        return DecoderLMWithPast(self)

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
                cache: CacheStep | None) -> torch.Tensor:
        body = self.model
        cos, sin = (c.unsqueeze(1) for c in body.rotary_emb(positions))

        def attention(layer: DecoderLayer, x: torch.Tensor) -> torch.Tensor:
            out, present = layer.self_attn(x, cos, sin, allowed, None if cache is None else cache.layer_past())
            if cache is not None:
                cache.presents += present
            return out

        h = body.embed_tokens(input_ids)
        x = self._attn_res(h, attention) if self.config.attn_res else self._standard(h, attention)
        return at_least_float32(self.lm_head(x))

    def export_plan(self, with_past: bool = False, fuse_norm: bool = False) -> ExportPlan:
        """The model as the exporter assembles it: ``decoder/plan.py``."""
        from attnres_export.models.decoder.plan import decoder_plan

        return decoder_plan(self, with_past, fuse_norm)


def _tie_again(model: DecoderLM, _incompatible) -> None:
    """``load_state_dict(assign=True)`` replaces both tensors of a tied pair; the head reads the embedding again."""
    model.lm_head.weight = model.model.embed_tokens.weight
