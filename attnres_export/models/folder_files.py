"""The files of a checkpoint folder (docs/models.md#checkpoint-folders), named in one place that imports nothing
heavy: the command line refuses a folder without its config before torch is imported."""

from __future__ import annotations

from pathlib import Path

from attnres_export.errors import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def require_config(path: Path) -> None:
    """Refuse a folder without ``config.json`` in one line; a file, or a path that is not there, passes."""
    if path.is_dir() and not (path / CONFIG_FILE).is_file():
        raise CheckpointError(f"{path}: a checkpoint folder needs {CONFIG_FILE} (and {WEIGHTS_FILE} or {INDEX_FILE})")
