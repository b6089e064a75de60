"""Depth aggregations of AttnRes (softmax over earlier sublayer outputs) fused into AttnResAggregate nodes."""
