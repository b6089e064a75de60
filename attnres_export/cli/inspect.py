"""``attnres inspect``: summarise a checkpoint or an ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from attnres_export.cli.framework import app, command, console


@command(app)
def inspect(file: Annotated[Path, typer.Argument(help="A checkpoint (.pt) or an ONNX file.")]) -> None:
    """Summarise a checkpoint (config, parameters) or an ONNX (opsets, inputs, attnres nodes)."""
    if file.suffix == ".onnx":
        _inspect_onnx(file)
    else:
        _inspect_checkpoint(file)


def _inspect_checkpoint(file: Path) -> None:
    from attnres_export.models import load_checkpoint

    model, cfg = load_checkpoint(file)
    table = Table(title=f"{file}: attnres checkpoint")
    table.add_column("key")
    table.add_column("value")
    for key, value in cfg.to_dict().items():
        table.add_row(key, str(value))
    table.add_row("parameters", f"{sum(p.numel() for p in model.parameters()):,}")
    table.add_row("fused attnres ops", str(model.fused_node_count()))
    console.print(table)


def _inspect_onnx(file: Path) -> None:
    from attnres_export.graphs.inspect import summarize
    from attnres_export.graphs.load import load_onnx

    summary = summarize(load_onnx(file, load_external_data=False))
    console.print(f"[bold]{file}[/bold]: target {summary.target}, {summary.nodes} nodes, opsets "
                  + ", ".join(f"{d} {v}" for d, v in summary.opsets.items()))
    io_table = Table(title="inputs and outputs")
    for column in ("kind", "name", "type", "dims"):
        io_table.add_column(column)
    for kind, values in (("input", summary.inputs), ("output", summary.outputs)):
        for name, type_name, dims in values:
            io_table.add_row(kind, name, type_name, " x ".join(dims))
    console.print(io_table)
    fused = Table(title="attnres nodes by source count (AttnResAggregate, AttnResAggregateNorm) or present inputs "
                        "(other ops)")
    for column in ("op", "sources / inputs", "nodes"):
        fused.add_column(column)
    for (op_type, arity), count in summary.fused_by_arity.items():
        fused.add_row(op_type, str(arity), str(count))
    if not summary.fused_by_arity:
        fused.add_row("(none)", "-", "0")
    console.print(fused)
    if summary.export_info:
        console.print("export: " + ", ".join(f"{k}={v}" for k, v in summary.export_info.items()))


