"""Renderers of the one report model: rich (terminal), JSON (CI), Markdown (pull requests).

Rich and Markdown share `savings_rows`, so their columns cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from fuse_cli.report.model import SCHEMA_VERSION, Report

SAVINGS_HEADERS = ("Pattern", "Pass", "Count", "Nodes removed", "Intermediates removed", "Activation memory saved")
NEAR_MISS_LIMIT = 20


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def savings_rows(report: Report) -> list[tuple[str, ...]]:
    """The table body plus a total line, as display strings."""
    rows = []
    for row in report.rows():
        saved = human_bytes(row.removed_bytes)
        if row.unknown_sizes:
            saved += f" (+{row.unknown_sizes} of unknown size)"
        rows.append((row.pattern, row.pass_name, str(row.count), str(row.nodes_removed),
                     str(row.intermediates_removed), saved))
    if rows:
        all_rows = report.rows()
        rows.append(("Total", "", str(sum(r.count for r in all_rows)), str(sum(r.nodes_removed for r in all_rows)),
                     str(sum(r.intermediates_removed for r in all_rows)), human_bytes(report.removed_bytes)))
    return rows


def summary_lines(report: Report) -> list[str]:
    lines = [
        f"Nodes: {report.nodes_before} -> {report.nodes_after} ({report.nodes_after - report.nodes_before:+d})",
        f"Weights: {human_bytes(report.weight_bytes_before)} -> {human_bytes(report.weight_bytes_after)}",
    ]
    if report.unbound_dims:
        lines.append(f"Symbolic dims taken as 1 for the estimate: {', '.join(report.unbound_dims)} "
                     "(bind them with --dim NAME=VALUE)")
    if report.dims:
        lines.append("Bound dims: " + ", ".join(f"{k}={v}" for k, v in report.dims))
    if report.dry_run:
        lines.append("Dry run: nothing written.")
    elif report.written_files:
        lines.append("Wrote " + ", ".join(report.written_files))
    return lines


def render_rich(report: Report, console: Console) -> None:
    title = f"fuse {'report' if report.dry_run else 'optimize'}: {report.model_path} (target {report.target})"
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(SAVINGS_HEADERS):
        table.add_column(header, justify="left" if i < 2 else "right")
    rows = savings_rows(report)
    for i, row in enumerate(rows):
        table.add_row(*row, style="bold" if i == len(rows) - 1 else None)
    if rows:
        console.print(table)
    else:
        console.print(f"[bold]{title}[/bold]\nNo fusion applied.")
    for line in summary_lines(report):
        console.print(line, highlight=False)
    if report.near_misses:
        misses = Table(title=f"Not fused ({len(report.near_misses)})", title_justify="left")
        for header in ("Pattern", "Nodes", "Why not"):
            misses.add_column(header, overflow="fold")
        for miss in report.near_misses[:NEAR_MISS_LIMIT]:
            misses.add_row(miss.pattern, " -> ".join(miss.nodes), miss.reason)
        console.print(misses)
        if len(report.near_misses) > NEAR_MISS_LIMIT:
            console.print(f"... and {len(report.near_misses) - NEAR_MISS_LIMIT} more (see --json)")


def to_json_dict(report: Report) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "fuse",
        "model": report.model_path,
        "output": report.output_path,
        "target": report.target,
        "passes": list(report.passes),
        "dry_run": report.dry_run,
        "nodes": {"before": report.nodes_before, "after": report.nodes_after},
        "weight_bytes": {"before": report.weight_bytes_before, "after": report.weight_bytes_after},
        "dims": dict(report.dims),
        "unbound_dims": list(report.unbound_dims),
        "fusions": [
            {"pattern": r.pattern, "pass": r.pass_name, "count": r.count, "nodes_removed": r.nodes_removed,
             "intermediates_removed": r.intermediates_removed, "removed_bytes": r.removed_bytes,
             "unknown_sizes": r.unknown_sizes, "peak_delta_bytes": r.peak_delta_bytes}
            for r in report.rows()
        ],
        "fusion_details": [
            {**asdict(f), "removed": [asdict(t) for t in f.removed]} for f in report.fusions
        ],
        "near_misses": [
            {"pattern": m.pattern, "pass": m.pass_name, "nodes": list(m.nodes), "reason": m.reason}
            for m in report.near_misses
        ],
        "written_files": list(report.written_files),
    }


def render_json(report: Report) -> str:
    return json.dumps(to_json_dict(report), indent=2, sort_keys=False) + "\n"


def render_markdown(report: Report) -> str:
    out = [f"### fuse: `{report.model_path}` (target `{report.target}`)", ""]
    rows = savings_rows(report)
    if rows:
        out.append("| " + " | ".join(SAVINGS_HEADERS) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(SAVINGS_HEADERS))) + "|")
        out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    else:
        out.append("No fusion applied.")
    out.append("")
    out += [f"- {line}" for line in summary_lines(report)]
    if report.near_misses:
        out += ["", f"<details><summary>Not fused ({len(report.near_misses)})</summary>", "",
                "| Pattern | Nodes | Why not |", "|---|---|---|"]
        out += [f"| {_md_escape(m.pattern)} | {_md_escape(' -> '.join(m.nodes))} | {_md_escape(m.reason)} |"
                for m in report.near_misses]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")
