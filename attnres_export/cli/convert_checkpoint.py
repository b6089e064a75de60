"""``attnres convert-checkpoint``: an attnres ``.pt`` checkpoint -> a Hugging Face style folder (config.json +
safetensors), which every command reads like the ``.pt`` and which loads without unpickling."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console
from attnres_export.cli.options import require_files
from attnres_export.errors import AttnresError
from attnres_export.models.folder_files import require_config


@command(app, name="convert-checkpoint")
def convert_checkpoint(
    source: Annotated[Path, typer.Argument(help="attnres checkpoint (.pt, or a checkpoint folder).")],
    out_dir: Annotated[Path, typer.Argument(help="Folder to write (must not exist, or be empty).")],
    max_shard_mb: Annotated[float | None, typer.Option(
        help="Split the weights into safetensors shards of at most this many MB, with model.safetensors.index.json."
    )] = None,
) -> None:
    """Write SOURCE as OUT_DIR/config.json + model.safetensors (or shards and their index)."""
    if max_shard_mb is not None and not max_shard_mb > 0:
        raise AttnresError(f"--max-shard-mb {max_shard_mb}: need a size > 0")
    require_files([("SOURCE", source)])
    check_outputs({}, {"SOURCE": source}, {"OUT_DIR": out_dir})
    require_config(source)
    from attnres_export.models import load_checkpoint
    from attnres_export.models.hf_folder import save_folder

    model, cfg = load_checkpoint(source)
    shard = int(max_shard_mb * (1 << 20)) if max_shard_mb else None
    files = save_folder(model.state_dict(), cfg, out_dir, shard)
    console.print(f"wrote [bold]{out_dir}[/bold]: {', '.join(f.name for f in files)}")
