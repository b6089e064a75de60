"""``attnres example``: write a randomly initialised reference checkpoint of any registered architecture."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console
from attnres_export.errors import AttnresError
from attnres_export.models.registry import ARCHITECTURES, architecture


@command(app)
def example(
    output: Annotated[Path, typer.Argument(help="Checkpoint file to write.")],
    arch: Annotated[str, typer.Option(help=f"Architecture: {', '.join(ARCHITECTURES)}.")] = "attnres-lm",
    residual: Annotated[str | None, typer.Option(help="attnres or standard (attnres-lm) [attnres].")] = None,
    block_size: Annotated[int | None, typer.Option(
        help="Sublayers per block; 0 = Full AttnRes (attnres-lm) [0].")] = None,
    running_mean: Annotated[bool, typer.Option(help="Divide layer l's summed scores by l+1 (realformer).")] = False,
    eps: Annotated[float | None, typer.Option(help="Norm epsilon [the family's: attnres-lm 1e-6, realformer "
                                                   "1e-12].")] = None,
    layers: Annotated[int, typer.Option(help="Transformer layers (2 sublayers each).")] = 2,
    d_model: Annotated[int, typer.Option(help="Model width D.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    d_ff: Annotated[int, typer.Option(help="MLP hidden size.")] = 128,
    vocab: Annotated[int, typer.Option(help="Vocabulary size.")] = 256,
    max_seq_len: Annotated[int, typer.Option(help="Longest sequence the model accepts.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Write a randomly initialised checkpoint (random, non-zero pseudo-queries)."""
    family = architecture(arch)
    config_type = family.config_type()
    accepted = {f.name for f in fields(config_type)}
    given = {"residual": residual, "block_size": block_size, "running_mean": running_mean or None, "eps": eps}
    for name, value in given.items():
        if value is not None and name not in accepted:
            raise AttnresError(f"--{name.replace('_', '-')} is not an option of {family.name} models "
                               f"({family.summary}); drop it or pick another --arch")
    from attnres_export.models import save_checkpoint
    from attnres_export.models.example import make_example

    cfg = config_type(arch=family.name, vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads,
                      d_ff=d_ff, max_seq_len=max_seq_len,
                      **{name: value for name, value in given.items() if value is not None})
    model = make_example(cfg, seed)
    save_checkpoint(model, cfg, output)
    console.print(f"wrote [bold]{output}[/bold]: {cfg.arch}, {cfg.describe()}, "
                  f"{layers} layers, D {d_model}, {sum(p.numel() for p in model.parameters()):,} parameters")
