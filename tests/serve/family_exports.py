"""Tiny random folders of every Hugging Face family (``attnres example --arch``) and their exports, for the
per-family matrices of tests/serve and tests/cli (slow: an export takes tens of seconds on two shared cores)."""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3-moe", "deepseek-v3", "kimi-linear")


def example_folder(family: str, out: Path, block_size: int | None = 1) -> Path:
    """A 2-layer random folder of ``family`` with Kimi K3 Attention Residuals (one layer a block)."""
    from attnres_export.models.registry import for_example

    entry, hf_type = for_example(family)
    folder, _, _ = entry.write_example_folder(hf_type, out, 0, block_size, 2)
    return folder


def export(folder: Path, out: Path, *, with_past: bool, target: str = "portable", dtype: str = "float32") -> Path:
    """``attnres-export FOLDER [--with-past] --target TARGET --seq 1:8:32 --past 0:8:31 --no-check``."""
    from attnres_export.dims import DimRange
    from attnres_export.exporter.checkpoint import export_checkpoint
    from attnres_export.exporter.options import ExportOptions

    export_checkpoint(ExportOptions(folder, out, target=target, dtype=dtype, with_past=with_past,
                                    seq=DimRange(1, 8, 32), past=DimRange(0, 8, 31) if with_past else None,
                                    check=False))
    return out
