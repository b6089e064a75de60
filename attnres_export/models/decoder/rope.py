"""Rotary position embeddings of the decoder families: inverse frequencies per ``rope_type`` and their application.

The frequencies are computed in float32 the way transformers computes them (``modeling_rope_utils``), so that
the angles at large positions agree with a transformers model to float32 rounding; cos and sin are taken from
``position_ids`` at run time (no table: any position works, and a left-padded row has its own positions), in
float32, times the rope type's attention scaling (yarn's ``attention_factor``, 1 otherwise).
"""

from __future__ import annotations

import math

import torch

from attnres_export.models.base import KeepFloat32
from attnres_export.models.decoder.config import RopeConfig
from attnres_export.ops.precision import at_least_float32


def inverse_frequencies(rope: RopeConfig, dim: int) -> torch.Tensor:
    """``[dim // 2]`` float32 inverse frequencies of ``rope`` for a rotary width ``dim``."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    base = rope.rope_theta ** exponents
    if rope.rope_type == "default":
        return 1.0 / base
    if rope.rope_type == "linear":
        return 1.0 / base / rope.factor
    if rope.rope_type == "llama3":
        return _llama3(1.0 / base, rope)
    return _yarn(base, rope, dim)


def attention_scaling(rope: RopeConfig) -> float:
    """The factor cos and sin are multiplied by: yarn's ``attention_factor``, else 1."""
    return rope.attention_factor if rope.rope_type == "yarn" else 1.0


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1: wavelengths longer than ``original / low_freq_factor`` are divided by ``factor``, shorter than
    ``original / high_freq_factor`` kept, and the band between interpolated smoothly."""
    original, factor = rope.original_max_position_embeddings, rope.factor
    low, high = rope.low_freq_factor, rope.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(base: torch.Tensor, rope: RopeConfig, dim: int) -> torch.Tensor:
    """YaRN: interpolated frequencies (divided by ``factor``) below the correction range, extrapolated ones
    above it, a linear ramp between; the range comes from ``beta_fast``/``beta_slow`` rotations over the
    pre-training context, rounded outwards when ``truncate``."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(rope.rope_theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    return 1.0 / (rope.factor * base) * (1 - extrapolated) + 1.0 / base * extrapolated


class RotaryEmbedding(KeepFloat32):
    """cos/sin ``[B, T, dim]`` float32 of ``position_ids`` (``cat(freqs, freqs)`` layout, as transformers)."""

    def __init__(self, rope: RopeConfig, dim: int) -> None:
        super().__init__()
        with torch.device("cpu"):  # computed, not loaded: real even when the model is built on "meta"
            inv_freq = inverse_frequencies(rope, dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scaling = attention_scaling(rope)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin in the frequencies' type: float32, float64 in a model cast to float64 (the reference)."""
        freqs = position_ids[..., None].to(self.inv_freq.dtype) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos() * self.scaling, angles.sin() * self.scaling


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of ``x [B, H, T, d]`` with ``cos``/``sin`` ``[B, 1, T, d]``, in float32, returned in x's
    dtype. "Rotate half" pairs dim ``i`` with ``i + d/2``; ``interleaved`` (DeepSeek's layout, as transformers
    applies it) pairs ``2i`` with ``2i + 1`` and writes the rotated pairs back as two halves."""
    xf = at_least_float32(x)
    half = xf.shape[-1] // 2
    if interleaved:
        c, s = cos[..., :half], sin[..., :half]
        even, odd = xf[..., 0::2], xf[..., 1::2]
        rotated = torch.cat([even * c - odd * s, odd * c + even * s], dim=-1)
    else:
        first, second = xf[..., :half], xf[..., half:]
        rotated = xf * cos + torch.cat([-second, first], dim=-1) * sin
    return rotated.to(x.dtype)
