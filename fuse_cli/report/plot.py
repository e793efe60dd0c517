"""The memory timeline as a chart: live activation bytes over execution, before and after fusion.

Hand-written SVG, because a two-line chart does not justify a plotting dependency; PNG is drawn by
matplotlib only where it is installed. Fusion removes nodes, so the two timelines have different
lengths: both are drawn over normalized execution progress, step i of n spanning [i/n, (i+1)/n].
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from fuse_cli.analysis.memory import MemoryProfile
from fuse_cli.errors import UsageError
from fuse_cli.report.files import replacing, write_text_atomically
from fuse_cli.report.model import Report
from fuse_cli.report.render import human_bytes
from fuse_cli.report.text import short_dim, visible, xml

X_TICKS = (0, 0.25, 0.5, 0.75, 1)
X_LABEL = "execution progress, normalized 0 to 1 (before and after have different node counts)"
# Where fusion left the timeline unchanged the lines coincide: the wider "before" line, drawn
# first, stays visible as a rim around the narrower "after" line.
BEFORE_STYLE, AFTER_STYLE = ("#1f6fb4", 3.5), ("#e0640c", 1.6)
_TICK_COUNT = 5  # gridlines aimed for; the step is the smallest power of two giving at most this many
_CHAR_WIDTH = 6.6  # px per character at font-size 12, to keep peak labels inside the plot
_LABEL_CHAR_FRACTION = 1 / 120  # of the plot's width per label character, to tell if two labels overlap


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    line_width: float
    points: tuple[tuple[float, int], ...]  # corners of the step line: (progress 0..1, live bytes)
    peak: tuple[float, int]  # the middle of the peak step
    peak_label: str
    label_level: int = 0  # 1: stacked above the other peak's label, which it would overlap


@dataclass(frozen=True)
class Chart:
    """What both the SVG and the PNG draw, so the two cannot disagree."""

    title: str
    series: tuple[Series, ...]
    y_ticks: tuple[int, ...]
    empty_reason: str = ""


def timeline_chart(report: Report) -> Chart:
    name = Path(report.model_path).name
    dims = ", ".join(f"{short_dim(k)}={v}" + (" assumed" if k in report.unbound_dims else "") for k, v in report.dims)
    title = f"Activation memory: {name}" + (f" ({dims})" if dims else "")
    audit = report.memory
    if audit is None:
        return Chart(title, (), (0, 1), "This report has no memory audit.")
    series = tuple(s for s in (_series("before fusion", BEFORE_STYLE, audit.before),
                               _series("after fusion", AFTER_STYLE, audit.after)) if s)
    if not series:
        return Chart(title, (), (0, 1), "The graph has no nodes: no timeline to draw.")
    ticks = _y_ticks(max(s.peak[1] for s in series))
    if len(series) == 2 and _labels_overlap(*series, ticks[-1]):
        series = (series[0], replace(series[1], label_level=1))
    return Chart(title, series, ticks)


def _series(label: str, style: tuple[str, float], profile: MemoryProfile) -> Series | None:
    steps = len(profile.timeline)
    if not steps:
        return None
    points = tuple((x / steps, live) for i, live in enumerate(profile.timeline) for x in (i, i + 1))
    return Series(f"{label} ({steps} steps)", *style, points, ((profile.peak_step + 0.5) / steps, profile.peak_bytes),
                  f"peak {human_bytes(profile.peak_bytes)} at {profile.peak_node}")


def _labels_overlap(a: Series, b: Series, y_max: int) -> bool:
    half_widths = (len(a.peak_label) + len(b.peak_label)) / 2 * _LABEL_CHAR_FRACTION
    return abs(a.peak[0] - b.peak[0]) < half_widths and abs(a.peak[1] - b.peak[1]) < 0.08 * y_max


def _y_ticks(peak: int) -> tuple[int, ...]:
    """Gridlines at a power-of-two step, so human_bytes labels them exactly (512 KiB, 1.0 MiB, ...),
    with one step of headroom above the peak for its label."""
    step = 1
    while step * _TICK_COUNT < peak:
        step *= 2
    return tuple(range(0, (peak // step + 1) * step + 1, step))


def render_timeline_svg(report: Report, *, width: int = 900, height: int = 320) -> str:
    chart = timeline_chart(report)
    left, right, top, bottom = 78, width - 24, 70, height - 50
    y_max = chart.y_ticks[-1]

    def px(x: float, y: float) -> tuple[float, float]:
        return left + x * (right - left), bottom - y / y_max * (bottom - top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="system-ui, Helvetica, Arial, sans-serif" '
           f'font-size="12" fill="#222">',
           f"<title>{xml(chart.title)}</title>",
           f'<rect width="{width}" height="{height}" fill="#fff"/>',
           f'<text x="{left}" y="24" font-size="15" font-weight="bold">{xml(chart.title)}</text>']
    if chart.empty_reason:
        out.append(_text(width / 2, (top + bottom) / 2, chart.empty_reason, anchor="middle", fill="#666"))
        return "\n".join(out + ["</svg>"]) + "\n"

    legend_x = left
    for s in chart.series:
        out.append(f'<line x1="{legend_x}" y1="44" x2="{legend_x + 22}" y2="44" stroke="{s.color}" '
                   f'stroke-width="{s.line_width}"/>')
        out.append(_text(legend_x + 28, 48, s.label))
        legend_x += 28 + len(s.label) * _CHAR_WIDTH + 24
    for tick in chart.y_ticks:
        _, y = px(0, tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e3e3e3"/>')
        out.append(_text(left - 8, y + 4, human_bytes(tick), anchor="end", fill="#555"))
    for fraction in X_TICKS:
        x, _ = px(fraction, 0)
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#888"/>')
        out.append(_text(x, bottom + 17, f"{fraction:g}", anchor="middle", fill="#555"))
    out.append(f'<path d="M{left},{top - 6}V{bottom}H{right}" fill="none" stroke="#888"/>')
    out.append(_text((left + right) / 2, height - 10, X_LABEL, anchor="middle", fill="#555"))

    for s in chart.series:
        corners = " ".join(f"{x:.1f},{y:.1f}" for x, y in (px(*p) for p in s.points))
        out.append(f'<polyline points="{corners}" fill="none" stroke="{s.color}" stroke-width="{s.line_width}" '
                   f'stroke-linejoin="round"/>')
    for s in chart.series:
        x, y = px(*s.peak)
        width_px = len(s.peak_label) * _CHAR_WIDTH
        x0 = min(max(x - width_px / 2, left + 2), right - width_px)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{s.color}" stroke="#fff" stroke-width="1.5"/>')
        out.append(_text(x0, y - 9 - 15 * s.label_level, s.peak_label, fill=s.color, halo=True))
    return "\n".join(out + ["</svg>"]) + "\n"


def _text(x: float, y: float, text: str, *, anchor: str = "start", fill: str = "#222", halo: bool = False) -> str:
    # A white outline painted under the glyphs keeps a label legible where it crosses a line.
    outline = ' stroke="#fff" stroke-width="3" paint-order="stroke"' if halo else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}"{outline}>'
            f"{xml(text)}</text>")


def write_plot(report: Report, path: str | os.PathLike) -> None:
    """SVG, or PNG when the path ends in .png and matplotlib is installed."""
    target = Path(path)
    if target.suffix.lower() == ".png":
        with replacing(target) as temp:
            _write_png(timeline_chart(report), temp)
    else:
        write_text_atomically(target, render_timeline_svg(report))


def _write_png(chart: Chart, path: Path) -> None:
    try:  # imported here: matplotlib is an optional extra, needed for PNG only
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("PNG needs matplotlib (pip install matplotlib); write .svg instead") from None
    with matplotlib.rc_context({"text.parse_math": False}):  # a "$" in a tensor name is text, not TeX
        figure = Figure(figsize=(9, 3.2), dpi=150, layout="constrained")
        axes = figure.add_subplot()
        axes.set_title(visible(chart.title), loc="left", fontweight="bold")
        axes.set_xlim(0, 1)
        axes.set_ylim(0, chart.y_ticks[-1])
        axes.set_yticks(chart.y_ticks, [human_bytes(t) for t in chart.y_ticks])
        axes.set_xticks(X_TICKS, [f"{x:g}" for x in X_TICKS])
        axes.grid(axis="y", color="#e3e3e3")
        axes.set_axisbelow(True)
        axes.set_xlabel(X_LABEL)
        if chart.empty_reason:
            axes.text(0.5, 0.5, chart.empty_reason, ha="center", transform=axes.transAxes)
        for s in chart.series:
            xs, ys = zip(*s.points)
            axes.plot(xs, ys, color=s.color, linewidth=s.line_width * 0.6, label=visible(s.label))  # points, not pixels
            axes.plot(*s.peak, "o", color=s.color, markeredgecolor="#fff")
            axes.annotate(visible(s.peak_label), s.peak, xytext=(0, 6 + 11 * s.label_level), textcoords="offset points",
                          ha="center", color=s.color)
        if chart.series:
            axes.legend(loc="best", frameon=False)
        figure.savefig(path)
