"""``attnres example``: write a randomly initialised checkpoint of any registered architecture: a ``.pt`` for our own
families, a Hugging Face folder (config.json + safetensors, as transformers writes it) for the decoder families."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated

import typer

from attnres_export.atomic import check_outputs
from attnres_export.cli.framework import app, command, console
from attnres_export.cli.options import choice
from attnres_export.errors import AttnresError
from attnres_export.models.registry import ARCHITECTURES, for_example, hf_model_types

EXAMPLE_ARCHS = [*(a for a, entry in ARCHITECTURES.items() if not entry.hf_model_types),
                 *(t.replace("_", "-") for t in hf_model_types())]
"""Our own families by name, the Hugging Face families by model_type (``qwen3-moe`` spells ``qwen3_moe``)."""


@command(app)
def example(
    output: Annotated[Path, typer.Argument(help="Checkpoint file (.pt) or, for a Hugging Face family, folder to "
                                                "write.")],
    arch: Annotated[str, choice(EXAMPLE_ARCHS, "Architecture, or Hugging Face family.")] = "attnres-lm",
    residual: Annotated[str | None, typer.Option(help="attnres or standard (attnres-lm) [attnres].")] = None,
    block_size: Annotated[int | None, typer.Option(
        help="attnres-lm: sublayers per block, 0 = Full AttnRes [0]. Hugging Face families: decoder layers per "
             "block of Kimi K3's Attention Residuals [none: standard residuals].")] = None,
    running_mean: Annotated[bool, typer.Option(help="Divide layer l's summed scores by l+1 (realformer).")] = False,
    eps: Annotated[float | None, typer.Option(help="Norm epsilon [the family's: attnres-lm 1e-6, realformer "
                                                   "1e-12].")] = None,
    layers: Annotated[int, typer.Option(help="Transformer layers (2 sublayers each).")] = 2,
    d_model: Annotated[int, typer.Option(help="Model width D (our families).")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads (our families).")] = 4,
    d_ff: Annotated[int, typer.Option(help="MLP hidden size (our families).")] = 128,
    vocab: Annotated[int, typer.Option(help="Vocabulary size (our families).")] = 256,
    max_seq_len: Annotated[int, typer.Option(help="Longest sequence the model accepts (our families).")] = 512,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Write a randomly initialised checkpoint (random, non-zero pseudo-queries)."""
    family, hf_type = for_example(arch)
    if hf_type is not None:
        check_outputs({}, {}, {"OUTPUT": output})
        _hf_example(family, hf_type, output, block_size, layers, seed,
                    {"--residual": residual, "--running-mean": running_mean or None, "--eps": eps})
        return
    check_outputs({"OUTPUT": output}, {})
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
                  f"{_count(layers, 'layer')}, D {d_model}, {sum(p.numel() for p in model.parameters()):,} parameters")


def _hf_example(family, hf_type: str, output: Path, block_size: int | None, layers: int, seed: int,
                refused: dict) -> None:
    """A tiny random folder of the Hugging Face family ``hf_type``, with K3 AttnRes when ``block_size`` is given."""
    for option, value in refused.items():
        if value is not None:
            raise AttnresError(f"{option} is not an option of the {hf_type} example (its sizes are the family's "
                               "tiny example's; --block-size adds Kimi K3's Attention Residuals)")
    if block_size is not None and block_size < 1:
        raise AttnresError(f"--block-size {block_size}: Kimi K3's blocks hold at least one decoder layer")
    folder, _, params = family.write_example_folder(hf_type, output, seed, block_size, layers)
    residual = f"K3 AttnRes, {_count(block_size, 'layer')} a block" if block_size else "standard residuals"
    console.print(f"wrote [bold]{folder}[/bold]: {hf_type} folder (config.json + model.safetensors), {residual}, "
                  f"{_count(layers, 'layer')}, {params:,} parameters")


def _count(number: int, noun: str) -> str:
    """``1 layer``, ``4 layers``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"
