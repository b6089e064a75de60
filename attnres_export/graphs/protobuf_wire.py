"""Protobuf wire-format pieces for writing parts of an ONNX model as bytes (a one-file model's staged prefix,
exporter/staging.py, and the in-place rewrite of a staged tensor, graphs/onnxruntime_ops/qmoe.py)."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_delimited_tag(field: int) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return varint(field << 3 | 2)
