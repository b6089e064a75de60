"""Attention layers with residual scores (RealFormer) fused into ResidualScoreAttention nodes."""
