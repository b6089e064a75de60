"""``KimiDeltaAttention``: one Kimi Delta Attention layer, computing what transformers 5.23's
``KimiLinearDeltaAttention`` computes (its PyTorch path), with the state passed in and returned
(docs/models.md#kimi-delta-attention).

The projections, short convolutions, gates and the gated output norm are standard ops in the dtype
transformers uses for each; the gated delta rule itself is one ``attnres::kimi_delta_attention`` call, so an
export holds one ``KimiDeltaAttention`` node per layer. Parameters carry the names of the checkpoint files
(``q_conv1d``, ``f_a_proj``, ``A_log`` ... directly under the layer, as transformers saves them and Moonshot
ships them), so a folder's tensors load as they are; ``state_dict_from_transformers`` maps the layout a live
transformers module holds (one stacked ``conv1d``, a ``forget_gate`` submodule).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from attnres_export.models.base import KeepFloat32
from attnres_export.models.kimi.config import KdaConfig
from attnres_export.ops.kimi_delta import kimi_delta_attention
from attnres_export.ops.precision import at_least_float32

L2NORM_EPS = 1e-6
"""eps of the L2 norm of q and k (fla's kernels and transformers' ``l2norm``)."""

SOFTPLUS_LINEAR_ABOVE = 20.0
"""transformers' forget gate takes softplus(x) = x above this."""


class KdaState(NamedTuple):
    """What a KDA layer carries from one call to the next."""

    recurrent: torch.Tensor
    """``[B, H, dk, dv]``, float32 (float64 in a float64 model)."""
    conv_q: torch.Tensor
    """``[B, H*dk, conv_size - 1]``: the last inputs of the q convolution, in the model dtype."""
    conv_k: torch.Tensor
    conv_v: torch.Tensor


class GatedRMSNorm(nn.Module):
    """transformers' ``KimiLinearRMSNormGated``: RMSNorm over the head dim, times sigmoid(gate), in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        wide = at_least_float32(x)
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (at_least_float32(self.weight) * normed * torch.sigmoid(at_least_float32(gate))).to(x.dtype)


class KimiDeltaAttention(KeepFloat32):
    """One KDA layer: ``forward`` over T tokens from a state (zeros when None), ``step`` for one token. The decay
    parameters and the short-convolution weights stay float32 in every model dtype, as transformers keeps them for
    the KDA of ``Glm5Next`` (``_keep_in_fp32_modules_strict``) and vLLM and SGLang create ``A_log`` and ``dt_bias``:
    rounding ``dt_bias`` (magnitudes up to about 7) to bfloat16 moves every token's decay by the same amount, an
    error the recurrence compounds over the sequence (docs/models.md#kda-precision)."""

    FLOAT32_TENSORS = frozenset({"A_log", "dt_bias", "q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"})

    def __init__(self, cfg: KdaConfig) -> None:
        super().__init__()
        d, h, dk = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        self.num_heads, self.head_dim, self.conv_size = h, dk, cfg.conv_size
        width = h * dk
        self.q_proj = nn.Linear(d, width, bias=False)
        self.k_proj = nn.Linear(d, width, bias=False)
        self.v_proj = nn.Linear(d, width, bias=False)
        self.q_conv1d = self._short_conv(width, cfg.conv_size)
        self.k_conv1d = self._short_conv(width, cfg.conv_size)
        self.v_conv1d = self._short_conv(width, cfg.conv_size)
        self.f_a_proj = nn.Linear(d, dk, bias=False)
        self.f_b_proj = nn.Linear(dk, width, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(width))
        self.A_log = nn.Parameter(torch.zeros(1, 1, h, 1))
        self.b_proj = nn.Linear(d, h, bias=False)
        self.gate_lower_bound = cfg.gate_lower_bound
        if cfg.full_rank_gate:
            self.g_proj = nn.Linear(d, width, bias=False)
        else:
            self.g_a_proj = nn.Linear(d, dk, bias=False)
            self.g_b_proj = nn.Linear(dk, width, bias=False)
        self.o_norm = GatedRMSNorm(dk, cfg.norm_eps)
        self.o_proj = nn.Linear(width, d, bias=False)

    @staticmethod
    def _short_conv(width: int, size: int) -> nn.Conv1d:
        return nn.Conv1d(width, width, size, groups=width, bias=False)

    def initial_state(self, batch: int) -> KdaState:
        """The zero state a sequence starts from."""
        weight = self.q_proj.weight
        width = self.num_heads * self.head_dim
        conv = weight.new_zeros(batch, width, self.conv_size - 1)
        recurrent = weight.new_zeros(batch, self.num_heads, self.head_dim, self.head_dim,
                                     dtype=torch.promote_types(weight.dtype, torch.float32))
        return KdaState(recurrent, conv, conv.clone(), conv.clone())

    def forward(self, hidden_states: torch.Tensor, state: KdaState | None = None
                ) -> tuple[torch.Tensor, KdaState]:
        """``hidden_states [B, T, D]`` -> ``([B, T, D]``, the state after the T tokens)."""
        b, t, _ = hidden_states.shape
        if state is None:
            state = self.initial_state(b)
        heads = (b, t, self.num_heads, self.head_dim)
        q, conv_q = self._convolve(self.q_proj(hidden_states), self.q_conv1d, state.conv_q)
        k, conv_k = self._convolve(self.k_proj(hidden_states), self.k_conv1d, state.conv_k)
        v, conv_v = self._convolve(self.v_proj(hidden_states), self.v_conv1d, state.conv_v)
        beta = torch.sigmoid(self.b_proj(hidden_states))
        core, recurrent = kimi_delta_attention(
            q.view(heads), k.view(heads), v.view(heads), self._log_decay(hidden_states), beta,
            state.recurrent, self.head_dim**-0.5, L2NORM_EPS,
        )
        gate = self._output_gate(hidden_states).view(heads)
        out = self.o_proj(self.o_norm(core, gate).reshape(b, t, -1))
        return out, KdaState(recurrent, conv_q, conv_k, conv_v)

    def step(self, hidden_state: torch.Tensor, state: KdaState) -> tuple[torch.Tensor, KdaState]:
        """One token: ``hidden_state [B, D]`` -> ``([B, D]``, the next state); the decode form."""
        out, state = self(hidden_state[:, None], state)
        return out[:, 0], state

    def _convolve(self, x: torch.Tensor, conv: nn.Conv1d, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise convolution of ``x [B, T, C]`` after the cached inputs, then SiLU; returns the
        output ``[B, T, C]`` and the last ``conv_size - 1`` inputs.

        The convolution accumulates in float32 and rounds to T once, as PyTorch's and cuDNN's half-precision
        convolutions do; it also keeps a bfloat16 export valid ONNX (``Conv`` takes bfloat16 only from opset 22).
        """
        window = torch.cat([cache.to(x.dtype), x.transpose(1, 2)], dim=-1)  # [B, C, conv_size - 1 + T]
        mixed = F.conv1d(at_least_float32(window), at_least_float32(conv.weight), groups=window.shape[1])
        return F.silu(mixed.to(x.dtype)).transpose(1, 2), window[:, :, x.shape[1]:]

    def _output_gate(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The pre-sigmoid gate of the output norm: low-rank (Kimi Linear) or K3's full-rank ``g_proj``."""
        if hasattr(self, "g_proj"):
            return self.g_proj(hidden_states)
        return self.g_b_proj(self.g_a_proj(hidden_states))

    def _log_decay(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """transformers' ``KimiLinearForgetGate``: ``-exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)`` in float32,
        ``[B, T, H, dk]``; with K3's ``gate_lower_bound``, ``lower_bound * sigmoid(exp(A_log) * (f + dt_bias))``."""
        b, t, _ = hidden_states.shape
        logits = at_least_float32(self.f_b_proj(self.f_a_proj(hidden_states))) + at_least_float32(self.dt_bias)
        logits = logits.view(b, t, self.num_heads, self.head_dim)
        if self.gate_lower_bound is not None:
            return self.gate_lower_bound * torch.sigmoid(torch.exp(at_least_float32(self.A_log)) * logits)
        softplus = torch.where(logits > SOFTPLUS_LINEAR_ABOVE, logits, torch.log(1.0 + torch.exp(logits)))
        return -torch.exp(at_least_float32(self.A_log)) * softplus


def state_dict_from_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The parameters of a live transformers ``KimiLinearDeltaAttention`` (``module.state_dict()``) under this
    module's names: the stacked ``conv1d.weight`` split into q, k, v, the ``forget_gate.`` prefix dropped. (A
    checkpoint folder needs no such step: transformers saves, and Moonshot ships, these names.)"""
    out = {}
    for name, tensor in state.items():
        if name == "conv1d.weight":
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                out[f"{part}_conv1d.weight"] = chunk
        else:
            out[name.removeprefix("forget_gate.")] = tensor
    return out
