"""``attnres example``: write a randomly initialised reference checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres.cli._app import app, console, friendly_errors


@app.command()
def example(
    output: Annotated[Path, typer.Argument(help="Checkpoint file to write.")],
    residual: Annotated[str, typer.Option(help="attnres or standard.")] = "attnres",
    block_size: Annotated[int, typer.Option(help="Sublayers per block; 0 = Full AttnRes.")] = 0,
    layers: Annotated[int, typer.Option(help="Transformer layers (2 sublayers each).")] = 2,
    d_model: Annotated[int, typer.Option(help="Model width D.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    d_ff: Annotated[int, typer.Option(help="MLP hidden size.")] = 128,
    vocab: Annotated[int, typer.Option(help="Vocabulary size.")] = 256,
    max_seq_len: Annotated[int, typer.Option(help="Longest sequence the model accepts.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Write a randomly initialised checkpoint (random, non-zero pseudo-queries)."""
    _example(output, residual, block_size, layers, d_model, heads, d_ff, vocab, max_seq_len, seed)


@friendly_errors
def _example(output, residual, block_size, layers, d_model, heads, d_ff, vocab, max_seq_len, seed) -> None:
    from attnres.models import ModelConfig, save_checkpoint
    from attnres.models.example import make_example

    cfg = ModelConfig(arch="attnres-lm", vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads,
                      d_ff=d_ff, residual=residual, block_size=block_size, max_seq_len=max_seq_len)
    model = make_example(cfg, seed)
    save_checkpoint(model, cfg, output)
    console.print(f"wrote [bold]{output}[/bold]: {cfg.arch}, residual {residual}, block size {block_size}, "
                  f"{layers} layers, D {d_model}, {sum(p.numel() for p in model.parameters()):,} parameters")
