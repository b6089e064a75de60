"""Fusing the subgraphs of models written elsewhere into attnres nodes, one pattern per op (docs/fusion.md)."""

from attnres_export.graphs.fusion.feeds import random_feeds
from attnres_export.graphs.fusion.fuse import fuse_model
from attnres_export.graphs.fusion.numerics import Numerics
from attnres_export.graphs.fusion.pattern import PATTERNS, FusionPattern
from attnres_export.graphs.fusion.result import FusionResult, Replacement, SiteOutcome

__all__ = ["PATTERNS", "FusionPattern", "FusionResult", "Numerics", "Replacement", "SiteOutcome", "fuse_model",
           "random_feeds"]
