"""``attnres example``: write a randomly initialised reference checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console
from attnres_export.errors import AttnresError

REALFORMER_EPS = 1e-12
"""BERT's LayerNorm epsilon, the default of realformer examples."""


@command(app)
def example(
    output: Annotated[Path, typer.Argument(help="Checkpoint file to write.")],
    arch: Annotated[str, typer.Option(help="attnres-lm (decoder LM) or realformer (encoder, residual scores).")] =
    "attnres-lm",
    residual: Annotated[str, typer.Option(help="attnres or standard (attnres-lm only).")] = "attnres",
    block_size: Annotated[int, typer.Option(help="Sublayers per block; 0 = Full AttnRes (attnres-lm only).")] = 0,
    running_mean: Annotated[bool, typer.Option(help="Divide layer l's summed scores by l+1 (realformer only).")] =
    False,
    eps: Annotated[float | None, typer.Option(help="Norm epsilon [attnres-lm 1e-6, realformer 1e-12].")] = None,
    layers: Annotated[int, typer.Option(help="Transformer layers (2 sublayers each).")] = 2,
    d_model: Annotated[int, typer.Option(help="Model width D.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    d_ff: Annotated[int, typer.Option(help="MLP hidden size.")] = 128,
    vocab: Annotated[int, typer.Option(help="Vocabulary size.")] = 256,
    max_seq_len: Annotated[int, typer.Option(help="Longest sequence the model accepts.")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Write a randomly initialised checkpoint (random, non-zero pseudo-queries)."""
    from attnres_export.models import ModelConfig, save_checkpoint
    from attnres_export.models.example import make_example

    if arch == "realformer":
        if residual != "attnres" or block_size:
            raise AttnresError("--residual and --block-size are AttnRes options; realformer takes neither")
        arch_options = {"residual": "standard", "block_size": 0, "running_mean": running_mean,
                        "eps": REALFORMER_EPS if eps is None else eps}
        shape = f"running mean {'on' if running_mean else 'off'}"
    else:
        if running_mean:
            raise AttnresError("--running-mean is a realformer option; add --arch realformer")
        arch_options = {"residual": residual, "block_size": block_size} | ({} if eps is None else {"eps": eps})
        shape = f"residual {residual}, block size {block_size}"
    cfg = ModelConfig(arch=arch, vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads, d_ff=d_ff,
                      max_seq_len=max_seq_len, **arch_options)
    model = make_example(cfg, seed)
    save_checkpoint(model, cfg, output)
    console.print(f"wrote [bold]{output}[/bold]: {cfg.arch}, {shape}, "
                  f"{layers} layers, D {d_model}, {sum(p.numel() for p in model.parameters()):,} parameters")
