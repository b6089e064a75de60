"""``attnres inspect``: summarise a checkpoint or an ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console
from attnres_export.cli.options import require_files


@command(app)
def inspect(file: Annotated[Path, typer.Argument(help="A checkpoint (.pt) or an ONNX file.")]) -> None:
    """Summarise a checkpoint (config, parameters) or an ONNX (opsets, inputs, attnres nodes)."""
    require_files([("FILE", file)])
    if file.suffix == ".onnx":
        _inspect_onnx(file)
    else:
        _inspect_checkpoint(file)


def _inspect_checkpoint(file: Path) -> None:
    from attnres_export.cli.render import table_of
    from attnres_export.models import load_checkpoint

    model, cfg = load_checkpoint(file)
    features = getattr(cfg, "features", None)
    rows = features() if features else [(key, str(value)) for key, value in cfg.to_dict().items()]
    rows += [("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
             ("fused attnres ops", str(model.fused_node_count()))]
    console.print(table_of(f"{file}: {cfg.arch} ({cfg.describe()})", ("key", "value"), rows))


def _inspect_onnx(file: Path) -> None:
    from attnres_export.cli.render import table_of
    from attnres_export.graphs.inspect import summarize
    from attnres_export.graphs.load import load_onnx

    summary = summarize(load_onnx(file, load_external_data=False))
    console.print(f"[bold]{file}[/bold]: target {summary.target}, {summary.nodes} nodes, opsets "
                  + ", ".join(f"{d} {v}" for d, v in summary.opsets.items()))
    rows = [(kind, name, type_name, " x ".join(dims))
            for kind, values in (("input", summary.inputs), ("output", summary.outputs))
            for name, type_name, dims in values]
    console.print(table_of("inputs and outputs", ("kind", "name", "type", "dims"), rows))
    arities = [(op_type, str(arity), str(count)) for (op_type, arity), count in summary.fused_by_arity.items()]
    console.print(table_of("attnres nodes by source count (AttnResAggregate, AttnResAggregateNorm) or present inputs "
                           "(other ops)", ("op", "sources / inputs", "nodes"), arities or [("(none)", "-", "0")]))
    if summary.export_info:
        console.print("export: " + ", ".join(f"{k}={v}" for k, v in summary.export_info.items()))


