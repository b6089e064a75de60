"""What the folder writers (``--genai``, ``--hf-onnx``) share: reading a source folder's small JSON files, and
refusing to replace a folder the command did not write."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from attnres_export.errors import ExportError

MAX_JSON_BYTES = 1 << 20


def json_object(path: Path, option: str, limit: int = MAX_JSON_BYTES) -> dict:
    """A JSON object file of at most ``limit`` bytes, or {} when there is none; errors name ``option``."""
    if not path.is_file():
        return {}
    if path.stat().st_size > limit:
        raise ExportError(f"{option}: {path} is over {limit >> 20} MB; not a model configuration file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportError(f"{option}: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ExportError(f"{option}: {path} is not a JSON object")
    return data


def refuse_unless_replaceable(folder: Path, option: str, kind: str, not_ours: Callable[[Path], str | None]) -> None:
    """A folder the export may replace is new, empty, or one an earlier export of ``option`` wrote (``not_ours``
    says why it is not, None when it is): a folder the command did not write is never replaced."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise ExportError(f"{option} {folder} is not a folder (a file or a link); choose a folder path")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    reason = not_ours(folder)
    if reason is not None:
        raise ExportError(f"{option} {folder} exists and is not {kind} attnres-export wrote ({reason}), so it is not "
                          f"replaced; move it away or choose another {option} folder")
