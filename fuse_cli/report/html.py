"""The report as one self-contained HTML page: inline CSS and SVG, no scripts, no external assets.

Tables and lines come from the same functions as the rich and Markdown renderers, so they agree.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from fuse_cli.analysis.memory import LiveTensor
from fuse_cli.report.files import write_text_atomically
from fuse_cli.report.model import Report
from fuse_cli.report.plot import render_timeline_svg
from fuse_cli.report.render import SAVINGS_HEADERS, human_bytes, memory_lines, savings_rows, summary_lines
from fuse_cli.report.text import short_dims_in, xml

_CSS = """
body { font: 14px/1.45 system-ui, Helvetica, Arial, sans-serif; color: #222; max-width: 1100px;
       margin: 24px auto; padding: 0 16px; }
h1 { font-size: 20px; margin-bottom: 4px; } h2 { font-size: 16px; margin: 28px 0 8px; }
table { border-collapse: collapse; margin: 8px 0; } caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 600; border-top: 2px solid #bbb; }
td { overflow-wrap: anywhere; }
.pair { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 32px; } .muted { color: #666; }
svg { max-width: 100%; height: auto; }
"""


def render_html(report: Report) -> str:
    title = f"fuse {'report' if report.dry_run else 'optimize'}: {Path(report.model_path).name}"
    body = [f"<h1>{xml(title)}</h1>",
            f'<p class="muted">{xml(report.model_path)} &middot; target {xml(report.target)} '
            f"&middot; passes: {xml(', '.join(report.passes))}</p>",
            "<h2>Savings</h2>"]
    rows = savings_rows(report)
    body.append(_table(SAVINGS_HEADERS, rows, numeric_from=2, total_row=True) if rows else "<p>No fusion applied.</p>")
    # summary_lines already carries the notes ("Note: ..."): listing report.notes again printed each twice
    body.append(_list(summary_lines(report) + memory_lines(report)))
    audit = report.memory
    if audit is not None:
        body += ["<h2>Activation memory over execution</h2>", render_timeline_svg(report)]
        for side_by_side in (
            ((f"Alive at the peak, before fusion ({audit.before.peak_node or '-'})", audit.before.live_at_peak),
             (f"Alive at the peak, after fusion ({audit.after.peak_node or '-'})", audit.after.live_at_peak)),
            (("Largest activations, before fusion", audit.before.largest),
             ("Largest activations, after fusion", audit.after.largest)),
        ):
            body += ['<div class="pair">', *(_tensor_table(c, t) for c, t in side_by_side), "</div>"]
        ops = dict.fromkeys([*audit.before.by_op_type, *audit.after.by_op_type])
        op_rows = [(op, human_bytes(audit.before.by_op_type.get(op, 0)), human_bytes(audit.after.by_op_type.get(op, 0)))
                   for op in ops]
        body += ["<h2>Bytes written per op type</h2>", _table(("Op type", "Before", "After"), op_rows, numeric_from=1)]
    if report.near_misses:
        misses = [(m.pattern, m.pass_name, " -> ".join(m.nodes), short_dims_in(m.reason)) for m in report.near_misses]
        body += [f"<h2>Not fused ({len(misses)})</h2>", _table(("Pattern", "Pass", "Nodes", "Why not"), misses)]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{xml(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric_from: int | None = None,
           total_row: bool = False, caption: str = "") -> str:
    """Columns from index `numeric_from` on are right-aligned; `total_row` makes the last row bold."""
    def cell(tag: str, i: int, text: str) -> str:
        css = ' class="num"' if numeric_from is not None and i >= numeric_from else ""
        return f"<{tag}{css}>{xml(text)}</{tag}>"

    rows = list(rows)
    out = ["<table>"] + ([f"<caption>{xml(caption)}</caption>"] if caption else [])
    out.append("<tr>" + "".join(cell("th", i, h) for i, h in enumerate(headers)) + "</tr>")
    for n, row in enumerate(rows):
        css = ' class="total"' if total_row and n == len(rows) - 1 else ""
        out.append(f"<tr{css}>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>")
    return "\n".join(out + ["</table>"])


def _tensor_table(caption: str, tensors: Sequence[LiveTensor]) -> str:
    rows = [(t.name, t.producer, human_bytes(t.nbytes)) for t in tensors]
    return _table(("Tensor", "Produced by", "Size"), rows, numeric_from=2, caption=caption)


def _list(lines: Sequence[str]) -> str:
    return "<ul>\n" + "\n".join(f"<li>{xml(line)}</li>" for line in lines) + "\n</ul>"


def write_html(report: Report, path: str | os.PathLike) -> None:
    write_text_atomically(path, render_html(report))
