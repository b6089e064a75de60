"""Decoder LM bodies with transformers' semantics, and their feed-forwards."""
