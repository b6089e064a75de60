"""Fusing the depth aggregations of AttnRes graphs written elsewhere into AttnResAggregate nodes (docs/fusion.md)."""

from attnres_export.graphs.fusion.feeds import random_feeds
from attnres_export.graphs.fusion.fuse import FusionResult, SiteOutcome, fuse_model
from attnres_export.graphs.fusion.numerics import Numerics

__all__ = ["FusionResult", "Numerics", "SiteOutcome", "fuse_model", "random_feeds"]
