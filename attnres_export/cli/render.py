"""Tables of results: the library returns data, the command line renders it (rich stays out of the core).

Every table fits the console it is printed on: a table with many columns is an ``Adaptive`` renderable that, at
render time, takes the first of its layouts whose natural width fits (all columns in one table; one table per
artifact with the artifact in its title; one wrapped line per row), so no number is ever cut at 80 columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from attnres_export.backends.bench import Workload
from attnres_export.graphs.fusion import FusionResult
from attnres_export.parity.metrics import ErrorMetrics
from attnres_export.parity.polygraphy_io import Replay
from attnres_export.parity.report import Check, Report

OUTPUT_NAME_WIDTH = 10
"""Where a narrow table folds an output name (``present.10.value``) onto a second line."""
SCALED_TITLE = "Parity against the PyTorch model run in float64 (bars scale with float32 PyTorch's own error)"
SAME_TYPE_TITLE = ("Parity against the PyTorch model run in float64 (bars scale with PyTorch's own error in float32 "
                   "and in the artifact's 16-bit type)")
OWN_ERRORS = {"pytorch_float32_rel_l2": ("f32\nrel L2", "f32 PyTorch rel L2"),
              "pytorch_same_type_rel_l2": ("16-bit\nrel L2", "16-bit PyTorch rel L2")}
"""PyTorch's own errors against float64 that scale the bars: the column heading and the narrow-console label."""


UNBOUNDED = 10_000


class Adaptive:
    """The first of ``layouts`` whose tables fit the console at their natural width (titles and other text
    wrap); the last layout always renders."""

    def __init__(self, *layouts: Callable[[], list[RenderableType]]) -> None:
        self.layouts = layouts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        unbounded = options.update_width(UNBOUNDED)  # a measurement is clamped to the width it is given
        for make in self.layouts[:-1]:
            parts = make()
            widths = [Measurement.get(console, unbounded, p).maximum for p in parts if isinstance(p, Table)]
            if max(widths, default=0) <= options.max_width:
                yield from parts
                return
        yield from self.layouts[-1]()


def _table(title: str | None = None) -> Table:
    """A table without vertical rules or edges (two spaces between columns), so more columns fit a line."""
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                 title_justify="left")


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _cosine(value: float) -> str:
    return f"{value:.9f}"


def _bar(value: float | None) -> str:
    """A cosine bar with the decimals it needs (0.999999, 0.99999955), up to nine."""
    return "-" if value is None else f"{value:.9f}".rstrip("0").rstrip(".")


def _verdict(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[red]NO[/red]"


def _shape(check: Check) -> str:
    return "x".join(map(str, check.shape))


def report_table(report: Report, title: str = "Parity against the float32 PyTorch reference") -> Adaptive:
    """Every output of every check with its errors and the bar it was judged against (``<= bar`` for relative
    L2, ``>= bar`` for cosine); max abs and max rel (reported, not judged) only where they fit."""
    own = tuple(field for field in OWN_ERRORS
                if any(getattr(m, field) is not None for c in report.checks for m in c.outputs.values()))
    title = SAME_TYPE_TITLE if "pytorch_same_type_rel_l2" in own else SCALED_TITLE if own else title
    return Adaptive(lambda: _parity_wide(report, title, own), lambda: _parity_sections(report, title, own),
                    lambda: _parity_sections(report, title, own, fold=True),
                    lambda: _parity_lines(report, title, own))


def _judged(m: ErrorMetrics, own: tuple[str, ...], bars: bool = True) -> list[str]:
    return [_g(m.rel_l2), *([_g(m.rel_l2_bar)] if bars else []), *(_g(getattr(m, field)) for field in own),
            _cosine(m.cosine), *([_bar(m.cosine_bar)] if bars else []), _verdict(m.ok)]


def _judged_columns(table: Table, own: tuple[str, ...], bars: bool = True) -> None:
    for column in ("rel L2", *(["<= bar"] if bars else []), *(OWN_ERRORS[field][0] for field in own), "cosine",
                   *([">= bar"] if bars else [])):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("pass")


def _parity_wide(report: Report, title: str, own: tuple[str, ...]) -> list[RenderableType]:
    table = _table()
    for column in ("backend", "artifact", "shape", "output"):
        table.add_column(column)
    table.add_column("max abs", justify="right", no_wrap=True)
    table.add_column("max rel", justify="right", no_wrap=True)
    _judged_columns(table, own)
    for check in report.checks:
        for name, m in check.outputs.items():
            table.add_row(check.backend, check.artifact, _shape(check), name, _g(m.max_abs), _g(m.max_rel),
                          *_judged(m, own))
    return [Text(title, style="italic"), table]


def _sections(report: Report) -> list[tuple[str, list[Check]]]:
    key = lambda c: (c.artifact, c.backend, c.dtype)  # noqa: E731
    return [(f"{artifact} on {backend} ({dtype})", list(group))
            for (artifact, backend, dtype), group in groupby(report.checks, key=key)]


def _parity_sections(report: Report, title: str, own: tuple[str, ...], fold: bool = False) -> list[RenderableType]:
    """One table per artifact; a section whose rows share one bar names it in its title instead of two columns.
    ``fold``: long output names wrap onto a second line."""
    tables: list[RenderableType] = [Text(title, style="italic")]
    for header, checks in _sections(report):
        shared = {(m.rel_l2_bar, m.cosine_bar) for c in checks for m in c.outputs.values()}
        bars = len(shared) > 1
        if not bars:
            rel_bar, cos_bar = shared.pop()
            header += f": rel L2 <= {_g(rel_bar)} and cosine >= {_bar(cos_bar)}"
        table = _table(header)
        table.add_column("shape")
        table.add_column("output", overflow="fold", max_width=OUTPUT_NAME_WIDTH if fold else None)
        _judged_columns(table, own, bars)
        for check in checks:
            for name, m in check.outputs.items():
                table.add_row(_shape(check), name, *_judged(m, own, bars))
        tables.append(table)
    return tables


def _parity_lines(report: Report, title: str, own: tuple[str, ...]) -> list[RenderableType]:
    """One short line per value, for consoles too narrow for any table."""
    lines: list[RenderableType] = [Text(title, style="italic")]
    for header, checks in _sections(report):
        lines.append(Text(header, style="bold"))
        for check in checks:
            for name, m in check.outputs.items():
                lines += [Text.from_markup(f"  {_shape(check)} {escape(name)}: {_verdict(m.ok)}"),
                          Text(f"    rel L2 {_g(m.rel_l2)} <= {_g(m.rel_l2_bar)}"),
                          Text(f"    cosine {_cosine(m.cosine)} >= {_bar(m.cosine_bar)}"),
                          *(Text(f"    {OWN_ERRORS[field][1]} {_g(getattr(m, field))}") for field in own),
                          Text(f"    max abs {_g(m.max_abs)}, max rel {_g(m.max_rel)}")]
    return lines


def replay_lines(replays: Sequence[Replay]) -> list[str]:
    """Per artifact: where its Polygraphy replay runs and the one command that runs it (or why there is none)."""
    lines = []
    for replay in replays:
        lines.append(f"polygraphy replay of {replay.artifact}: {replay.where}")
        if replay.script is not None:
            lines.append(f"  sh {replay.script}   # {len(replay.commands)} polygraphy run(s), one per shape, at the "
                         "check's bars")
    return lines


def fusion_table(fusion: FusionResult) -> Table:
    summary = fusion.to_dict()
    found = [f"{op}: {counts['found']} found, {counts['fused']} fused, {counts['unfused']} left unfused"
             for op, counts in summary["by_op"].items() if counts["found"]]
    table = _table(f"Fusion sites: {'; '.join(found) or 'none found'}; {summary['attention']} attention and "
                   f"{summary['other']} other softmaxes left alone")
    for column in ("softmax", "kind", "sources", "result", "eps", "rel L2", "reason"):
        table.add_column(column, no_wrap=column in ("sources", "eps", "rel L2"), overflow="fold")
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


BENCH_TITLE = "Latency (median, p90, p99) and throughput at the median"


def bench_table(workloads: Sequence[Workload]) -> Adaptive:
    return Adaptive(lambda: _bench_wide(workloads), lambda: _bench_sections(workloads),
                    lambda: _bench_lines(workloads))


def _timings(w: Workload) -> list[str]:
    sequences, tokens = w.throughput()
    return [f"{w.percentile(50):.3f}", f"{w.percentile(90):.3f}", f"{w.percentile(99):.3f}", f"{sequences:,.1f}",
            f"{tokens:,.0f}"]


def _timing_columns(table: Table) -> None:
    for column in ("median ms", "p90 ms", "p99 ms", "seq/s", "tokens/s"):
        table.add_column(column, justify="right", no_wrap=True)


def _bench_wide(workloads: Sequence[Workload]) -> list[RenderableType]:
    table = _table()
    for column in ("artifact", "backend", "clock", "shape"):
        table.add_column(column)
    _timing_columns(table)
    for w in workloads:
        table.add_row(w.artifact, w.backend, w.clock.name, "x".join(map(str, w.shape)), *_timings(w))
    return [Text(BENCH_TITLE, style="italic"), table]


def _bench_sections(workloads: Sequence[Workload]) -> list[RenderableType]:
    tables: list[RenderableType] = [Text(BENCH_TITLE, style="italic")]
    for (artifact, backend, clock), group in groupby(workloads, key=lambda w: (w.artifact, w.backend, w.clock.name)):
        table = _table(f"{artifact} on {backend} ({clock})")
        table.add_column("shape")
        _timing_columns(table)
        for w in group:
            table.add_row("x".join(map(str, w.shape)), *_timings(w))
        tables.append(table)
    return tables


def _bench_lines(workloads: Sequence[Workload]) -> list[RenderableType]:
    lines: list[RenderableType] = [Text(BENCH_TITLE, style="italic")]
    for w in workloads:
        median, p90, p99, sequences, tokens = _timings(w)
        lines += [Text(f"{w.artifact} on {w.backend} ({w.clock.name}) at {'x'.join(map(str, w.shape))}", style="bold"),
                  Text(f"  median {median} ms, p90 {p90} ms, p99 {p99} ms"),
                  Text(f"  {sequences} seq/s, {tokens} tokens/s")]
    return lines


def table_of(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """A plain table of strings (long values fold onto more lines)."""
    table = _table(title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table
