"""Tables of results: the library returns data, the command line renders it (rich stays out of the core).

Every table fits the console it is printed on: a table with many columns is an ``Adaptive`` renderable that, at
render time, takes the first of its layouts whose natural width fits (all columns in one table; one table per
artifact with the artifact in its title; one wrapped line per row), so no number is ever cut at 80 columns. The
fusion table keeps each site on one line instead, cutting long node names in their middle (``FusionTable``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # types of what is rendered only: importing them would import torch before every table
    from attnres_export.backends.bench import Workload
    from attnres_export.graphs.fusion import FusionResult, SiteOutcome
    from attnres_export.parity.metrics import ErrorMetrics
    from attnres_export.parity.polygraphy_io import Replay
    from attnres_export.parity.report import Check, Report

OUTPUT_NAME_WIDTH = 8
"""Where a narrow table folds an output name (``present.10.value``) onto a second line."""
SCALED_TITLE = "Parity against the PyTorch model run in float64 (bars scale with float32 PyTorch's own error)"
SAME_TYPE_TITLE = ("Parity against the PyTorch model run in float64 (bars scale with PyTorch's own error in float32 "
                   "and in the artifact's 16-bit type)")
OWN_ERRORS = {"pytorch_float32_rel_l2": ("PyTorch\nf32 rel L2", "PyTorch float32 rel L2"),
              "pytorch_same_type_rel_l2": ("PyTorch\n16-bit rel L2", "PyTorch 16-bit rel L2")}
"""PyTorch's own errors against float64 that scale the bars: the column heading (its last line differs from the
artifact's ``rel L2``) and the narrow-console label."""
WITH_PAST_SHAPES = "shape: batch x new tokens x past tokens"
"""The legend of a with-past check's three-number shapes (``1x8x0``: a prefill of 8 tokens)."""


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
    L2, ``>= bar`` for cosine); max abs (reported, not judged) only where it fits. Max rel stays in the JSON: near
    zero it is large for a passing output and would read as a failure."""
    own = tuple(field for field in OWN_ERRORS
                if any(getattr(m, field) is not None for c in report.checks for m in c.outputs.values()))
    title = SAME_TYPE_TITLE if "pytorch_same_type_rel_l2" in own else SCALED_TITLE if own else title
    if report.extra.get("with_past"):
        title += f"\n{WITH_PAST_SHAPES}"
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
    _judged_columns(table, own)
    for check in report.checks:
        for name, m in check.outputs.items():
            table.add_row(check.backend, check.artifact, _shape(check), name, _g(m.max_abs), *_judged(m, own))
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
                          Text(f"    max abs {_g(m.max_abs)}")]
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


SITE_NAME_MIN = 16
"""The narrowest a softmax name is cut to (in its middle, with an ellipsis) to keep its row on one line."""


class FusionTable:
    """The fusion sites, one table per kind of site, every row on one line: a softmax name too long for the
    console is cut in its middle (the JSON report keeps it whole) and the reasons, often long and repeated, are
    numbered notes under the tables, each written once."""

    def __init__(self, fusion: FusionResult) -> None:
        self.fusion = fusion
        patterns = list(fusion.kinds.values())
        by_kind: dict[str, list[SiteOutcome]] = {}
        for site in fusion.sites:
            by_kind.setdefault(site.kind, []).append(site)
        # the sites of each pattern, in the order the patterns ran, then those left alone
        self.sections = sorted(by_kind.items(), key=lambda item: patterns.index(item[0]) if item[0] in patterns
                               else len(patterns))
        reasons = (s.reason for _, sites in self.sections for s in sites if s.reason)
        self.notes = {reason: number for number, reason in enumerate(dict.fromkeys(reasons), 1)}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        summary = self.fusion.to_dict()
        found = [f"{op}: {counts['found']} found, {counts['fused']} fused, {counts['unfused']} left unfused"
                 for op, counts in summary["by_op"].items() if counts["found"]]
        yield Text(f"Fusion sites: {'; '.join(found) or 'none found'}; {summary['attention']} attention and "
                   f"{summary['other']} other softmaxes left alone", style="italic")
        unbounded = options.update_width(UNBOUNDED)
        for kind, sites in self.sections:
            table = self._section(kind, sites)
            excess = Measurement.get(console, unbounded, table).maximum - options.max_width
            if excess > 0:
                table = self._section(kind, sites, max(max(len(s.site) for s in sites) - excess, SITE_NAME_MIN))
            if Measurement.get(console, unbounded, table).maximum <= options.max_width:
                yield table
            else:
                yield from self._lines(kind, sites)
        if self.notes:
            notes = Table.grid(padding=(0, 1))
            notes.add_column(no_wrap=True)
            notes.add_column()
            for reason, number in self.notes.items():
                notes.add_row(Text(f"[{number}]"), Text(reason))
            yield notes

    def _section(self, kind: str, sites: list[SiteOutcome], name_width: int | None = None) -> Table:
        """The sites of one kind; a column none of them fills is left out."""
        ops = ", ".join(dict.fromkeys(s.op_type for s in sites if s.op_type))
        table = _table(f"{kind} ({ops})" if ops else kind)
        cells: dict[str, list[str | Text]] = {
            "softmax": [Text(_middle(s.site, name_width)) for s in sites],
            "sources": ["" if s.sources is None else str(s.sources) for s in sites],
            "result": [Text(_result(s), style=RESULT_STYLES.get(_result(s), "")) for s in sites],
            "eps": ["" if s.eps is None else f"{s.eps:.3g}" for s in sites],
            "rel L2": ["" if s.rel_l2 is None else f"{s.rel_l2:.2g}" for s in sites],
            "note": [Text(f"[{self.notes[s.reason]}]") if s.reason else "" for s in sites],
        }
        shown = {column: values for column, values in cells.items() if any(values)}
        for column in shown:
            table.add_column(column, no_wrap=True, justify="right" if column in ("sources", "eps", "rel L2")
                             else "left")
        for row in zip(*shown.values(), strict=True):
            table.add_row(*row)
        return table

    def _lines(self, kind: str, sites: list[SiteOutcome]) -> list[Text]:
        """The sites of one kind as one wrapped line each, for consoles too narrow for their table."""
        lines = [Text(kind, style="bold")]
        for s in sites:
            facts = [_result(s), f"sources {s.sources}" if s.sources is not None else "",
                     f"eps {s.eps:.3g}" if s.eps is not None else "",
                     f"rel L2 {s.rel_l2:.2g}" if s.rel_l2 is not None else ""]
            note = f" [{self.notes[s.reason]}]" if s.reason else ""
            lines.append(Text(f"  {s.site}: {', '.join(filter(None, facts))}{note}"))
        return lines


RESULT_STYLES = {"fused": "green", "unfused": "yellow"}


def _result(site: SiteOutcome) -> str:
    return ("fused" if site.fused else "unfused") if site.op_type else "left alone"


def _middle(text: str, width: int | None) -> str:
    """``text`` cut to ``width`` characters in its middle, keeping its start and its end (the layer and the node)."""
    if width is None or len(text) <= width:
        return text
    head = (width - 1) // 2
    return f"{text[:head]}…{text[len(text) - (width - 1 - head):]}"


def fusion_table(fusion: FusionResult) -> FusionTable:
    """What ``attnres fuse`` and the export of a model written elsewhere print about the sites they found."""
    return FusionTable(fusion)


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


def quantization_table(rows: list[dict]) -> Table:
    """How far the quantized model is from the unquantized one, per check shape (information, not judged)."""
    table = _table("Quantized vs unquantized model (float64 PyTorch; information, not judged)")
    for column in ("shape", "logits rel L2", "top-1 agreement"):
        table.add_column(column, justify="left" if column == "shape" else "right")
    for row in rows:
        table.add_row(row["shape"], _g(row["rel_l2"]), f"{100 * row['top1']:.1f}%")
    return table


def quantized_line(formats: dict[str, int], stored_bytes: int, parameters: int) -> str:
    """One line: how many weights the graph keeps quantized, in which formats, and their bytes per parameter."""
    listed = ", ".join(f"{count} {name}" for name, count in formats.items())
    return (f"kept {sum(formats.values())} weights quantized ({listed}): {stored_bytes / parameters:.3g} bytes per "
            "parameter")
