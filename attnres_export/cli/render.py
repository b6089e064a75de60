"""Tables of results: the library returns data, the command line renders it (rich stays out of the core)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from attnres_export.backends.bench import Workload
from attnres_export.graphs.fusion import FusionResult
from attnres_export.parity.report import Report


def report_table(report: Report, title: str = "Parity against the float32 PyTorch reference") -> Table:
    scaled = any(m.pytorch_float32_rel_l2 is not None for c in report.checks for m in c.outputs.values())
    if scaled:
        title = "Parity against the PyTorch model run in float64 (bars scale with float32 PyTorch's own error)"
    table = Table(title=title)
    columns = ["backend", "artifact", "shape", "output", "max abs", "max rel", "rel L2",
               *(["PyTorch f32 rel L2"] if scaled else []), "cosine", "pass"]
    for column in columns:
        table.add_column(column, justify="right" if column.startswith(("max", "rel", "cos", "PyT")) else "left")
    for check in report.checks:
        for name, m in check.outputs.items():
            own = [] if not scaled else ["" if m.pytorch_float32_rel_l2 is None else f"{m.pytorch_float32_rel_l2:.3g}"]
            table.add_row(
                check.backend, check.artifact, "x".join(map(str, check.shape)), name,
                f"{m.max_abs:.3g}", f"{m.max_rel:.3g}", f"{m.rel_l2:.3g}", *own, f"{m.cosine:.9f}",
                "[green]yes[/green]" if m.ok else "[red]NO[/red]",
            )
    return table


def fusion_table(fusion: FusionResult) -> Table:
    summary = fusion.to_dict()
    found = [f"{op}: {counts['found']} found, {counts['fused']} fused, {counts['unfused']} left unfused"
             for op, counts in summary["by_op"].items() if counts["found"]]
    table = Table(title=f"Fusion sites: {'; '.join(found) or 'none found'}; {summary['attention']} attention and "
                        f"{summary['other']} other softmaxes left alone")
    for column in ("softmax", "kind", "sources", "result", "eps", "rel L2", "reason"):
        table.add_column(column)
    for s in fusion.sites:
        result = "[green]fused[/green]" if s.fused else "[yellow]unfused[/yellow]" if s.op_type else "left alone"
        table.add_row(s.site, s.kind, "" if s.sources is None else str(s.sources), result,
                      "" if s.eps is None else f"{s.eps:.3g}", "" if s.rel_l2 is None else f"{s.rel_l2:.2g}",
                      s.reason)
    return table


def fusion_warnings(fusion: FusionResult) -> list[str]:
    """One line when sites of any pattern stay as standard ops (they run, without the fused node), then one per
    distinct warning of the fused sites, naming them."""
    lines = [f"[yellow]warning:[/yellow] {_sites(sites)}: {warning}" for warning, sites in fusion.warnings.items()]
    if fusion.unfused:
        lines.insert(0, f"[yellow]warning:[/yellow] {fusion.unfused_summary()} were not fused, or only in part, and "
                        "stay as standard ops (reasons in the table); --strict makes this an error")
    return lines


def _sites(sites: list[str]) -> str:
    shown = ", ".join(sites[:3])
    return f"{len(sites)} sites ({shown}{', ...' if len(sites) > 3 else ''})" if len(sites) > 1 else shown


def bench_table(workloads: Sequence[Workload]) -> Table:
    table = Table(title="Latency (median, p90, p99) and throughput at the median")
    for column in ("artifact", "backend", "clock", "shape", "median ms", "p90 ms", "p99 ms", "seq/s", "tokens/s"):
        table.add_column(column, justify="right" if column[0] in "mpst" and column != "shape" else "left")
    for w in workloads:
        sequences, tokens = w.throughput()
        table.add_row(w.artifact, w.backend, w.clock.name, "x".join(map(str, w.shape)),
                      f"{w.percentile(50):.3f}", f"{w.percentile(90):.3f}", f"{w.percentile(99):.3f}",
                      f"{sequences:,.1f}", f"{tokens:,.0f}")
    return table


def table_of(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A plain table of strings."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table
