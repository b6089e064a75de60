"""``KimiLinearLM`` (docs/models.md#kimi-linear): transformers 5.23's ``KimiLinearForCausalLM``, its layers Kimi
Delta Attention (``linear_attention``) or NoPE latent attention (``full_attention``), its feed-forwards dense or
DeepSeek-style MoE per ``mlp_layer_types``, with standard residuals or Kimi K3's Attention Residuals.

The residual streams, the K3 aggregation sites, the contract methods and ``init_example`` are ``CausalLM``'s
(``layers/causal_lm.py``; the layers carry its attribute names); what differs is the layers and the cache: no rotary
table, and per KDA layer a fixed-size state instead of a growing one (``kimi/with_past.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnres_export.models.kimi.kda import KdaState, KimiDeltaAttention
from attnres_export.models.kimi.lm_config import KimiLinearConfig
from attnres_export.models.kimi.mla import NopeLatentAttention
from attnres_export.models.kimi.mlp import feed_forward
from attnres_export.models.layers.causal_lm import CausalLM
from attnres_export.models.layers.norm import RMSNorm
from attnres_export.models.layers.residual import ResidualNorm, ResidualProjection
from attnres_export.ops.precision import at_least_float32

KDA_STATE_TENSORS = len(KdaState._fields)
MLA_STATE_TENSORS = 2


class KimiLinearLayer(nn.Module):
    """One decoder layer with transformers' names (``self_attn``, ``input_layernorm``, ``post_attention_layernorm``;
    the feed-forward is ``mlp`` here, ``block_sparse_moe`` in a folder) and, with AttnRes, K3's two sites."""

    def __init__(self, cfg: KimiLinearConfig, index: int) -> None:
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.linear = cfg.layer_types[index] == "linear_attention"
        self.self_attn = KimiDeltaAttention(cfg.kda) if self.linear else NopeLatentAttention(cfg)
        self.mlp = feed_forward(cfg, index)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        if cfg.attn_res:
            self.self_attention_res_norm = ResidualNorm(d, eps)
            self.self_attention_res_proj = ResidualProjection(d)
            self.mlp_res_norm = ResidualNorm(d, eps)
            self.mlp_res_proj = ResidualProjection(d)

    @property
    def state_tensors(self) -> int:
        return KDA_STATE_TENSORS if self.linear else MLA_STATE_TENSORS


class KimiLinearBody(nn.Module):
    """``model.``: embeddings, layers, the final norm (and with AttnRes the output site)."""

    def __init__(self, cfg: KimiLinearConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleList(KimiLinearLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        if cfg.attn_res:
            self.output_attn_res_norm = ResidualNorm(d, cfg.rms_norm_eps)
            self.output_attn_res_proj = ResidualProjection(d)


class StateStep:
    """The states of one with-past step: the pasts handed in (layer by layer), the presents made."""

    def __init__(self, past: list[torch.Tensor], new_tokens_mask: torch.Tensor) -> None:
        self.past, self.presents, self.new_tokens_mask = past, [], new_tokens_mask

    def layer_past(self, count: int) -> list[torch.Tensor]:
        start = len(self.presents)
        return self.past[start:start + count]


class KimiLinearLM(CausalLM):
    """A Kimi Linear LM; ``forward(input_ids [B, T]) -> logits [B, T, V]`` float32. The head is never tied to the
    embedding: transformers 5.23's ``KimiLinearForCausalLM`` ties nothing, whatever ``tie_word_embeddings`` says."""

    def __init__(self, cfg: KimiLinearConfig) -> None:
        super().__init__(cfg, KimiLinearBody(cfg))

    def init_example(self) -> None:
        """``CausalLM``'s example weights, and the forget gates as transformers initialises them (``A_log`` from
        U(1, 16), ``dt_bias`` the inverse softplus of a step in [1e-3, 1e-1])."""
        super().init_example()
        with torch.no_grad():
            for layer in self.model.layers:
                if layer.linear:
                    kda = layer.self_attn
                    kda.A_log.copy_(torch.empty_like(kda.A_log).uniform_(1.0, 16.0).log())
                    dt = torch.empty_like(kda.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp()
                    kda.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        positions = torch.arange(t, device=input_ids.device)
        causal = positions[None, :] <= positions[:, None]
        return self._kimi_logits(input_ids, causal[None, None], None)

    def forward_with_past(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                          past: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One prefill or decode step (docs/decode.md#kimi-linear-with-past): ``attention_mask [B, P+T]`` over past
        and new tokens; a latent-attention token at index ``t`` attends position ``j`` when ``j <= P + t`` and the
        mask allows ``j``; a KDA layer reads the new tokens zeroed where the mask is 0 (transformers'
        ``apply_mask_to_padding_states``). ``position_ids`` are accepted for the common step signature; no
        layer reads positions (NoPE)."""
        t, total = input_ids.shape[1], attention_mask.shape[1]
        key_pos = torch.arange(total, device=input_ids.device)
        query_pos = torch.arange(t, device=input_ids.device) + (total - t)
        allowed = (key_pos[None, :] <= query_pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
        step = StateStep(past, attention_mask[:, total - t:, None])
        return self._kimi_logits(input_ids, allowed, step), step.presents

    def fused_node_count(self) -> int:
        """attnres nodes an export holds: one per aggregation and one ``KimiDeltaAttention`` per KDA layer."""
        return self.aggregation_count() + sum(layer.linear for layer in self.model.layers)

    def with_past(self):
        from attnres_export.models.kimi.with_past import KimiLinearWithPast

        return KimiLinearWithPast(self)

    def export_plan(self, with_past: bool = False, fuse_norm: bool = False):
        """The model as the exporter assembles it: ``kimi/plan.py``."""
        from attnres_export.models.kimi.plan import kimi_plan

        return kimi_plan(self, with_past, fuse_norm)

    def _kimi_logits(self, input_ids: torch.Tensor, allowed: torch.Tensor, step: StateStep | None) -> torch.Tensor:
        def attention(layer: KimiLinearLayer, x: torch.Tensor) -> torch.Tensor:
            past = None if step is None else step.layer_past(layer.state_tensors)
            if layer.linear:
                if step is not None:
                    x = x * step.new_tokens_mask.to(x.dtype)
                out, state = layer.self_attn(x, None if past is None else KdaState(*past))
            else:
                out, state = layer.self_attn(x, allowed, None if past is None else (past[0], past[1]))
            if step is not None:
                step.presents += list(state)
            return out

        h = self.model.embed_tokens(input_ids)
        x = self._attn_res(h, attention) if self.config.attn_res else self._standard(h, attention)
        return at_least_float32(self.lm_head(x))

