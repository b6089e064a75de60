"""``attnres inspect``: summarise a checkpoint, a torch.export program (.pt2) or an ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attnres_export.cli.framework import app, command, console
from attnres_export.cli.options import require_files
from attnres_export.models.folder_files import require_config

NO_TARGET = "none (no attnres nodes and no attnres-export metadata: not written by attnres-export)"


@command(app)
def inspect(
    file: Annotated[Path, typer.Argument(help="A checkpoint (.pt or folder), a torch.export program (.pt2) or an "
                                              "ONNX file.")],
    trust_pickle: Annotated[bool, typer.Option(
        "--trust-pickle", help="A .pt2 whose archive would be unpickled: load it anyway (runs code from the file; "
                               "only for files you trust).")] = False,
    tensors: Annotated[bool, typer.Option(
        "--tensors", help="A checkpoint: list every tensor with its shape, storage format and bytes per parameter.")]
    = False,
) -> None:
    """Summarise a checkpoint (config, parameters), a .pt2 program (inputs, outputs and dims as attnres-export
    names them) or an ONNX (opsets, inputs, attnres nodes)."""
    require_files([("FILE", file)])
    if file.suffix == ".onnx":
        _inspect_onnx(file)
    elif file.suffix == ".pt2":
        _inspect_program(file, trust_pickle)
    else:
        require_config(file)
        _inspect_checkpoint(file, tensors)


def _inspect_checkpoint(file: Path, each_tensor: bool) -> None:
    """The config and the tensors' storage, from the config and the headers (no weight is read)."""
    import torch

    from attnres_export.cli.render import table_of
    from attnres_export.models.registry import build_model
    from attnres_export.models.store import open_checkpoint

    checkpoint = open_checkpoint(file)
    cfg = checkpoint.config
    with torch.device("meta"):
        model = build_model(cfg)
    features = getattr(cfg, "features", None)
    rows = features() if features else [(key, str(value)) for key, value in cfg.to_dict().items()]
    rows += [("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
             ("fused attnres ops", str(model.fused_node_count()))]
    console.print(table_of(f"{file}: {cfg.arch} ({cfg.describe()})", ("key", "value"), rows))
    console.print(table_of("tensors by storage format (as stored; bytes per parameter)",
                           ("format", "stored as", "tensors", "parameters", "bytes", "bytes/param"),
                           _storage_rows(checkpoint.tensors)))
    if each_tensor:
        console.print(table_of("every tensor (state_dict names; quantized experts stacked as the model holds them)",
                               ("tensor", "shape", "format", "bytes/param"), _tensor_rows(checkpoint.tensors)))


def _tensor_rows(tensors: dict) -> list[tuple[str, ...]]:
    from attnres_export.models.store.quantized import QuantizedTensor

    rows = []
    for name, stored in tensors.items():
        size = stored.stored_nbytes if isinstance(stored, QuantizedTensor) else stored.nbytes
        shown = stored.format if isinstance(stored, QuantizedTensor) else str(stored.dtype).removeprefix("torch.")
        rows.append((name, "x".join(map(str, stored.shape)), shown, f"{size / max(stored.numel(), 1):.3g}"))
    return rows


def _storage_rows(tensors: dict) -> list[tuple[str, ...]]:
    from attnres_export.cli.options import human_bytes
    from attnres_export.models.store.quantized import QuantizedTensor

    groups: dict[tuple[str, str], list[int]] = {}
    for stored in tensors.values():
        quantized = isinstance(stored, QuantizedTensor)
        kind = "packed parts" if quantized else str(stored.dtype).removeprefix("torch.")
        counts = groups.setdefault((stored.format, kind), [0, 0, 0])
        counts[0] += 1
        counts[1] += stored.numel()
        counts[2] += stored.stored_nbytes if quantized else stored.nbytes
    return [(fmt, kind, str(n), f"{params:,}", human_bytes(size), f"{size / max(params, 1):.3g}")
            for (fmt, kind), (n, params, size) in sorted(groups.items())]


def _inspect_program(file: Path, trust_pickle: bool) -> None:
    """A .pt2 read as the export reads it (exporter/pt2_archive.py: refused when a member would be unpickled)."""
    from attnres_export.cli.framework import readable_range
    from attnres_export.cli.render import table_of
    from attnres_export.exporter.foreign import load_program
    from attnres_export.exporter.program_names import summarize_program

    summary = summarize_program(load_program(file, trust_pickle))
    console.print(f"[bold]{file}[/bold]: torch.export program, {summary.nodes} ops ({summary.softmaxes} softmaxes, "
                  f"where fusion looks for aggregations), {summary.parameters:,} parameters")
    _print_values("inputs and outputs as exported", summary.inputs, summary.outputs)
    if summary.dims:
        console.print(table_of("dynamic dims", ("dim", "range"),
                               [(name, readable_range(low, high)) for name, low, high in summary.dims]))


def _inspect_onnx(file: Path) -> None:
    from attnres_export.cli.options import human_bytes
    from attnres_export.cli.render import table_of
    from attnres_export.graphs.inspect import summarize
    from attnres_export.graphs.load import load_onnx

    summary = summarize(load_onnx(file, load_external_data=False))
    console.print(f"[bold]{file}[/bold]: target {summary.target or NO_TARGET}, {summary.nodes} nodes, opsets "
                  + ", ".join(f"{d} {v}" for d, v in summary.opsets.items()))
    _print_values("inputs and outputs", summary.inputs, summary.outputs)
    arities = [(op_type, str(arity), str(count)) for (op_type, arity), count in summary.fused_by_arity.items()]
    console.print(table_of("attnres nodes by source count (AttnResAggregate, AttnResAggregateNorm) or present inputs "
                           "(other ops)", ("op", "sources / inputs", "nodes"), arities or [("(none)", "-", "0")]))
    if summary.weights:
        console.print(table_of("weights by stored type (bytes per parameter)",
                               ("type", "initializers", "elements", "bytes", "bytes/element"),
                               [(name, str(n), f"{elements:,}", human_bytes(size), f"{size / max(elements, 1):.3g}")
                                for name, (n, elements, size) in summary.weights.items()]))
    if summary.onnxruntime_ops is not None:
        ops = summary.onnxruntime_ops
        console.print(table_of("ONNX Runtime fused ops (com.microsoft)", ("op", "nodes"),
                               [(op, str(n)) for op, n in ops.nodes.items()] or [("(none matched)", "0")]))
        for line in ops.kept:
            console.print(f"kept in standard ops: {line}", highlight=False, soft_wrap=True)
    if summary.export_info:
        console.print("export: " + ", ".join(f"{k}={_recorded(k, v)}" for k, v in summary.export_info.items()))


def _recorded(key: str, value: object) -> object:
    """An export metadata value as ``inspect`` shows it: the weights with int8 activations counted, not listed."""
    from attnres_export.graphs.metadata import INT8_ACTIVATIONS_KEY

    if key == INT8_ACTIVATIONS_KEY and isinstance(value, dict):
        return f"{len(value)} MatMulNBits weights (accuracy_level 4)"
    return value


def _print_values(title: str, inputs: list[tuple[str, str, list[str]]],
                  outputs: list[tuple[str, str, list[str]]]) -> None:
    from attnres_export.cli.render import table_of

    rows = [(kind, name, type_name, " x ".join(dims))
            for kind, values in (("input", inputs), ("output", outputs)) for name, type_name, dims in values]
    console.print(table_of(title, ("kind", "name", "type", "dims"), rows))
