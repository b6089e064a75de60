"""Why a candidate site is left alone."""

from __future__ import annotations


class Rejected(Exception):
    """A Softmax that is not (provably) a depth aggregation; the message is the reason shown to the user."""
