"""Renderers of the one report model: rich (terminal), JSON (CI), Markdown (pull requests).

Rich and Markdown share `savings_rows`, so their columns cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.text import Text

from fuse_cli import __version__
from fuse_cli.analysis.bodies import BodyCost
from fuse_cli.report.model import SCHEMA_VERSION, Report, describe_rolled_back
from fuse_cli.report.table_fit import Column, fitted_table
from fuse_cli.report.text import markdown, plain, short_dim, short_dims_in, terminal, visible
from fuse_cli.report.upgrade_hint import upgrade_hint_lines
from fuse_cli.config import UNBOUND_DIM
from fuse_cli.input_domain import describe_setting
from fuse_cli.report.verification import INCONCLUSIVE, MATCH, MISMATCH, UNVERIFIABLE, VerifyResult
from fuse_cli.progress import BESIDE, StepTime, Timings

# "Tensors removed" are intermediate activations; "Memory saved" is their bytes at the bound shapes
# (the traffic that no longer happens); "Peak change" is what removing them alone does to the peak.
SAVINGS_HEADERS = ("Pattern", "Pass", "Count", "Nodes removed", "Tensors removed", "Memory saved", "Peak change")
# The terminal's table stacks the pass under its pattern (Markdown keeps the two columns).
PASS_NAME_KEPT = 24  # 80 columns hold a label this wide beside the figures
SAVINGS_COLUMNS = (Column("Pattern / pass", weight=2), *(Column(h, figure=True) for h in SAVINGS_HEADERS[2:]))
NEAR_MISS_COLUMNS = (Column("Pattern"), Column("Count", figure=True), Column("Nodes (first)"),
                     Column("Why not (first)", weight=2))
TENSOR_COLUMNS = (Column("Tensor", weight=2), Column("Produced by", weight=2), Column("Size", figure=True))
OP_TYPE_COLUMNS = (Column("Op type"), Column("Before", figure=True), Column("After", figure=True))
VERIFY_COLUMNS = (Column("Output", weight=2), Column("Shape, dtype", figure=True),
                  Column("Max abs / rel diff", figure=True), Column("Cosine", figure=True),
                  Column("atol / rtol", figure=True), Column("Result", min_width=7))
STEP_COLUMNS = (Column("Step", weight=2), Column("Runs", figure=True), Column("Seconds", figure=True),
                Column("Share", figure=True), Column("Peak RSS at its end", figure=True))
PASS_TIME_COLUMNS = (Column("Pass", whole=True), Column("Runs", figure=True), Column("Seconds", figure=True),
                     Column("Matching", figure=True), Column("Rewriting", figure=True))
RUN_TIME_COLUMNS = (Column("Model"), Column("Setting", weight=2), Column("Seconds", figure=True))
BATCH_COLUMNS = (Column("Model", weight=2), Column("Result", min_width=7), Column("Nodes", figure=True),
                 Column("Memory saved", figure=True), Column("Peak before -> after", figure=True),
                 Column("Output / error", weight=2))
SPARK = " ▁▂▃▄▅▆▇█"
NEAR_MISS_LIMIT = 20
INNER_DIMS_SHOWN = 3


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
    """The table body plus a total line, as display strings. The peak column adds up: each kind's
    part, then the rest (tensors that became weights, the new operators' buffers and scratch);
    the passes the peak guard left out show what they would have added (not in the total)."""
    rows = []
    for row in report.rows():
        saved = human_bytes(row.removed_bytes)
        if row.unknown_sizes:
            saved += f" (+{row.unknown_sizes} of unknown size)"
        rows.append((row.pattern, row.pass_name, str(row.count), str(row.nodes_removed),
                     str(row.intermediates_removed), saved, _signed_bytes(row.peak_delta_bytes)))
    if rows and report.memory is not None and report.memory.peak_delta_other:
        rows.append(("Rest: folded weights, new operators' buffers and scratch", "", "", "", "", "",
                     _signed_bytes(report.memory.peak_delta_other)))
    order = order_row(report)
    if order:
        rows.append(order)
    for decline in report.peak_guard:
        worst = max(decline.growth, key=lambda g: g.after_bytes - g.before_bytes)
        rows.append((decline.pattern, decline.pass_name, "-", "-", "-", "-",
                     f"left out: {_signed_bytes(worst.after_bytes - worst.before_bytes)}"))
    if report.rows() or order:
        all_rows = report.rows()
        total_peak = report.memory.after.peak_bytes - report.memory.before.peak_bytes if report.memory else None
        rows.append(("Total", "", str(sum(r.count for r in all_rows)), str(sum(r.nodes_removed for r in all_rows)),
                     str(sum(r.intermediates_removed for r in all_rows)), human_bytes(report.removed_bytes),
                     _signed_bytes(total_peak)))
    return rows


def order_row(report: Report) -> tuple[str, ...] | None:
    """The `schedule` pass's row, when it reordered: the peak in onnxruntime's order (the peak
    column's figures) and, where it ordered for the stored order too, that one's."""
    audit = report.memory
    record = next((r for r in report.orders if r.changed), None)
    if record is None or audit is None or audit.unscheduled is None:
        return None
    text = f"Node order: peak {human_bytes(audit.unscheduled.peak_bytes)} -> {human_bytes(audit.after.peak_bytes)}"
    for rule, before, after in zip(record.rules, record.peaks_before, record.peaks_after):
        if rule == "stored":
            text += f" (stored: {human_bytes(before[0])} -> {human_bytes(after[0])})"
    return (text, record.pass_name, "-", "0", "0", "-", _signed_bytes(audit.peak_delta_order))


def _signed_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n == 0:
        return "0"
    return ("-" if n < 0 else "+") + human_bytes(abs(n))


def _percent(before: int, after: int) -> str:
    return f"{(after - before) / before * 100:+.1f}%" if before else "n/a"


def verification_lines(report: Report) -> list[str]:
    # rolled-back passes are failures (FAILED lines, one per distinct reason) unless mismatches are allowed
    lines = ([f"Rolled back: {line}" for line in describe_rolled_back(report.rolled_back)]
             if report.allow_mismatch else [])
    result = report.verification
    if result is not None:
        lines.append(verdict_line(result))
    elif not report.dry_run:
        lines.append("NOT VERIFIED (--no-verify): the output was written unchecked")
    return lines


def verdict_line(result: VerifyResult) -> str:
    """One line a person and a CI log can read: the status first, then the evidence."""
    where = "; ".join([describe_setting(dict(s)) for s in result.settings]
                      + ([result.settings_note] if result.settings_note and result.settings else []))
    at = (f" at {len(result.settings)} shape setting{'s' if len(result.settings) != 1 else ''} ({where})"
          if where else "")
    if result.status == UNVERIFIABLE:
        return (f"UNVERIFIABLE: {result.reason}; the output was not checked "
                "(bind symbolic dims with --dim or --input-shape, integer ranges with --int-range, or pass "
                "--require-verified to fail)")
    if result.status == MISMATCH and not result.outputs:
        return f"Verified in onnxruntime (CPU, seeded random inputs{at}): MISMATCH: {result.reason}"
    worst_abs = max((o.max_abs_diff for o in result.outputs), default=0.0)
    worst_rel = max((o.max_rel_diff for o in result.outputs), default=0.0)
    cosine = min((o.cosine_similarity for o in result.outputs), default=1.0)
    verdict = {MATCH: "outputs match", MISMATCH: "OUTPUTS DIFFER",
               INCONCLUSIVE: f"INCONCLUSIVE ({result.reason})"}[result.status]
    # where a quantized output's tolerance is what onnxruntime's own optimizer moves it by, say so
    enveloped = [o for o in result.outputs if o.runtime_envelope is not None and o.atol == o.runtime_envelope]
    envelope = (f"; {len(enveloped)} output{'s' if len(enveloped) != 1 else ''} after a quantizer within what "
                f"onnxruntime's own optimizations move {'them' if len(enveloped) != 1 else 'it'} by "
                f"({max(o.runtime_envelope for o in enveloped):.3g})" if enveloped else "")
    flipped = [o for o in result.outputs if o.flipped_at and o.passed]
    flips = "".join(f"; {o.name!r} beyond that in {o.beyond} of {math.prod(o.shape)} elements at {o.flipped_at} "
                    f"(a rounding flip after a quantizer), within it on fresh inputs there" for o in flipped)
    return (f"Verified in onnxruntime (CPU, seeded random inputs{at}): {verdict}; {len(result.outputs)} outputs, "
            f"max abs diff {worst_abs:.3g}, max rel diff {worst_rel:.3g}, min cosine {cosine:.6f}{envelope}{flips}")


def memory_lines(report: Report) -> list[str]:
    """The model-level before -> after figures, and the one thing people misread."""
    audit = report.memory
    if audit is None:
        return []
    b, a = audit.before, audit.after
    lines = [
        f"Peak activation memory: {human_bytes(b.peak_bytes)} -> {human_bytes(a.peak_bytes)} "
        f"({_percent(b.peak_bytes, a.peak_bytes)}), at {b.peak_node or '-'} -> {a.peak_node or '-'}",
        f"Intermediate traffic (bytes written by nodes): {human_bytes(b.intermediate_bytes)} -> "
        f"{human_bytes(a.intermediate_bytes)} ({_percent(b.intermediate_bytes, a.intermediate_bytes)})",
    ]
    measured = report.measured
    if measured is not None:
        sides = [("before", b.peak_bytes, measured.before), ("after", a.peak_bytes, measured.after)]
        if measured.unscheduled is not None and audit.unscheduled is not None:
            sides.insert(1, ("after, input node order", audit.unscheduled.peak_bytes, measured.unscheduled))
        for label, estimate, m in sides:
            if m.peak_bytes is None:
                lines.append(f"Measured peak {label}: not measurable here ({m.reason})")
            else:
                ratio = f"{estimate / m.peak_bytes:.3f}" if m.peak_bytes else "n/a"
                line = (f"Measured peak {label} (onnxruntime CPU): {human_bytes(m.peak_bytes)}; "
                        f"estimate {human_bytes(estimate)} (estimate / measured = {ratio})")
                if m.allocated_bytes:
                    line += (f"; allocated {human_bytes(m.allocated_bytes)} "
                             f"(estimate / allocated = {estimate / m.allocated_bytes:.3f})")
                lines.append(line)
    if report.removed_bytes and a.peak_bytes - b.peak_bytes > -report.removed_bytes:
        lines.append("A removed intermediate lowers the peak only if it was alive at the peak; "
                     "the others save traffic, not peak.")
    lines += [body_note(cost) for cost in a.bodies or b.bodies]
    if b.unknown_tensors or a.unknown_tensors:
        names = ", ".join(b.unknown_tensors[:5]) + (" ..." if len(b.unknown_tensors) > 5 else "")
        lines.append(f"Unknown size, left out of the sums: {len(b.unknown_tensors)} tensors before"
                     f"{' (' + names + ')' if names else ''}, {len(a.unknown_tensors)} after")
    return lines


def body_note(cost: BodyCost) -> str:
    """Which body of a control-flow node the estimate counted, and its own peak."""
    if cost.op_type == "If":
        return (f"If {cost.node!r}: counted {cost.counted} ({cost.reason}, {human_bytes(cost.body_peak)}; "
                f"the other branch {human_bytes(cost.other_peak)})")
    if cost.iterations is None:
        return (f"{cost.op_type} {cost.node!r}: counted one iteration of its body ({human_bytes(cost.body_peak)}); "
                "the iteration count is unknown, so its scan outputs are not")
    return (f"{cost.op_type} {cost.node!r}: counted one iteration of its body ({human_bytes(cost.body_peak)}) "
            f"and the buffers of {cost.iterations} iterations")


def sparkline(timeline: tuple[int, ...], width: int = 60, scale: int | None = None) -> str:
    """Live bytes over execution steps, squeezed into `width` cells (max of each bucket)."""
    if not timeline:
        return ""
    scale = scale or max(timeline) or 1
    buckets = [max(timeline[i * len(timeline) // width:max((i + 1) * len(timeline) // width,
                                                           i * len(timeline) // width + 1)])
               for i in range(min(width, len(timeline)))]
    return "".join(SPARK[min(len(SPARK) - 1, round(v / scale * (len(SPARK) - 1)))] for v in buckets)


def summary_lines(report: Report) -> list[str]:
    lines = upgrade_hint_lines(report) + [
        f"Nodes: {report.nodes_before} -> {report.nodes_after} ({report.nodes_after - report.nodes_before:+d})",
        f"Weights: {human_bytes(report.weight_bytes_before)} -> {human_bytes(report.weight_bytes_after)}",
    ]
    bindable, inner = unbound_dims(report)
    if bindable:
        lines.append(f"Symbolic dims taken as {UNBOUND_DIM} for the estimate: {', '.join(map(short_dim, bindable))} "
                     "(bind them with --dim NAME=VALUE)")
    if inner:
        shown = ", ".join(map(short_dim, inner[:INNER_DIMS_SHOWN])) + (" ..." if len(inner) > INNER_DIMS_SHOWN else "")
        noun, them = ("dims", "them") if len(inner) != 1 else ("dim", "it")
        lines.append(f"Also taken as {UNBOUND_DIM}: {len(inner)} {noun} inside the graph that shape inference could "
                     f"not size ({shown}); no graph input has {them}, so no option binds {them}")
    dims = [(k, v) for k, v in report.dims if k not in inner]
    if dims:
        lines.append("Bound dims: " + ", ".join(f"{short_dim(k)}={v}" for k, v in dims))
    if report.runtime_target_would_add:
        extra = ", ".join(f"+{count} {pattern}" for pattern, count in report.runtime_target_would_add)
        lines.append(f"With --target ort (onnxruntime's fused operators) fuse would also make: {extra}")
    lines += verification_lines(report)
    lines += [f"Note: {note}" for note in report.notes]
    lines += [f"FAILED: {failure}" for failure in report.failures]
    if report.dry_run:
        lines.append("Dry run: nothing written.")
    elif report.written_files:
        lines.append("Wrote " + ", ".join(report.written_files))
    return [short_dims_in(line) for line in lines]  # notes and failures quote dims too


def unbound_dims(report: Report) -> tuple[list[str], list[str]]:
    """The symbols the estimate took as 1, split: those of graph inputs, the user's to bind with
    --dim, and those inside the graph (onnx's unk__N, an exporter's names on intermediates),
    which follow from the inputs or from data and which no option binds."""
    if report.input_dims is None:
        return list(report.unbound_dims), []
    inputs = set(report.input_dims)
    return ([d for d in report.unbound_dims if d in inputs], [d for d in report.unbound_dims if d not in inputs])


def render_rich(report: Report, console: Console) -> None:
    title = f"fuse {'report' if report.dry_run else 'optimize'}: {terminal(report.model_path)} (target {report.target})"
    rows = savings_rows(report)
    if rows:
        # a pass name is a word to copy into --passes: the label column folds none of usual length
        longest = max(len(visible(row[1])) for row in rows)
        label = dataclasses.replace(SAVINGS_COLUMNS[0], min_width=min(longest, PASS_NAME_KEPT))
        console.print(fitted_table((label, *SAVINGS_COLUMNS[1:]), [_savings_cells(row) for row in rows],
                                   console.width, title=title, styles=[None] * (len(rows) - 1) + ["bold"],
                                   sections=[True] * len(rows)))
    else:
        console.print(f"[bold]{title}[/bold]\nNo fusion applied.")
    for line in summary_lines(report) + memory_lines(report):
        console.print(plain(line), highlight=False)
    if report.dry_run and report.memory:
        _render_audit(report, console)
    if report.near_misses:
        groups = near_miss_groups(report)
        cells = [(plain(pattern), plain(str(len(items))), plain(" -> ".join(items[0].nodes)),
                  plain(short_dims_in(items[0].reason)))
                 for pattern, items in groups[:NEAR_MISS_LIMIT]]
        console.print(fitted_table(NEAR_MISS_COLUMNS, cells, console.width,
                                   title=f"Not fused ({len(report.near_misses)})"))
        if len(groups) > NEAR_MISS_LIMIT:
            console.print(f"... and {len(groups) - NEAR_MISS_LIMIT} more kinds (see --json)")


def _savings_cells(row: tuple[str, ...]) -> list[Text]:
    """A savings row for the terminal: the pass under its pattern, so the label column gets the
    width two would share (at 80 columns two label columns are 11 cells each, a pattern folded
    into strips that are not read); a rule between rows says which pass is whose."""
    pattern, pass_name, *figures = row
    label = plain(pattern)
    if pass_name:
        label.append("\n" + visible(pass_name), style="dim")
    return [label, *map(plain, figures)]


def near_miss_groups(report: Report) -> list[tuple[str, list]]:
    """Near-misses grouped by pattern and by the reason's wording with node names left out, so
    62 BatchNormalizations declined for one reason take one line, not 62."""
    groups: dict[tuple[str, str], list] = {}
    for miss in report.near_misses:
        # names are quoted or carry digits (n901, 'r886', bn_3); what is left is the reason's kind
        wording = re.sub(r"'[^']*'|\b\w*\d\w*\b", "", miss.reason)
        for name in miss.nodes:
            wording = wording.replace(name, "")
        groups.setdefault((miss.pattern, wording), []).append(miss)
    return [(pattern, items) for (pattern, _), items in groups.items()]


def _render_audit(report: Report, console: Console) -> None:
    """The memory audit's detail: where the bytes go, before fusion and after."""
    audit = report.memory
    scale = max(audit.before.peak_bytes, audit.after.peak_bytes, 1)
    console.print("Live activations over execution steps (peak marked by the tallest bar, same scale):",
                  highlight=False)
    lines = [("before", audit.before.timeline), ("after", audit.after.timeline)]
    if audit.unscheduled is not None:  # the `schedule` pass reordered: the fused model in its input order too
        lines.insert(1, ("after, input node order", audit.unscheduled.timeline))
    width = max(len(label) for label, _ in lines)
    cells = max(1, min(60, console.width - width - 5))  # "  label |...|" on one line
    for label, timeline in lines:
        console.print(f"  {label:<{width}} |{sparkline(timeline, width=cells, scale=scale)}|", highlight=False)
    for title, tensors in (("Alive at the peak (after fusion)", audit.after.live_at_peak[:10]),
                           ("Largest activations (after fusion)", audit.after.largest)):
        rows = [(plain(t.name), plain(t.producer), plain(human_bytes(t.nbytes))) for t in tensors]
        console.print(fitted_table(TENSOR_COLUMNS, rows, console.width, title=title))
    rows = [(plain(op), plain(human_bytes(audit.before.by_op_type.get(op, 0))),
             plain(human_bytes(audit.after.by_op_type.get(op, 0))))
            for op in dict.fromkeys([*audit.before.by_op_type, *audit.after.by_op_type])]
    console.print(fitted_table(OP_TYPE_COLUMNS, rows, console.width, title="Bytes written per op type"))


def to_json_dict(report: Report) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "fuse_version": __version__,
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
        "notes": list(report.notes),
        "measured": None if report.measured is None else {
            "peak_bytes": {"before": report.measured.before.peak_bytes, "after": report.measured.after.peak_bytes,
                           "after_input_order": None if report.measured.unscheduled is None
                           else report.measured.unscheduled.peak_bytes},
            "allocated_bytes": {"before": report.measured.before.allocated_bytes,
                                "after": report.measured.after.allocated_bytes,
                                "after_input_order": None if report.measured.unscheduled is None
                                else report.measured.unscheduled.allocated_bytes},
            "method": report.measured.before.method,
            "reason": report.measured.before.reason or report.measured.after.reason,
        },
        "verification": None if report.verification is None else _verification_json(report.verification),
        "rolled_back": [asdict(r) for r in report.rolled_back],
        "peak_guard": [{"pass": d.pass_name, "pattern": d.pattern, "growth": [asdict(g) for g in d.growth]}
                       for d in report.peak_guard],
        "peak_guard_settings": [dict(s) for s in report.peak_settings],
        "peak_guard_tolerance_bytes": list(report.peak_tolerances),
        "runtime_target_would_add": [{"pattern": p, "count": c} for p, c in report.runtime_target_would_add],
        "schedule": [_order_json(record) for record in report.orders],
        "failures": list(report.failures),
        "exit_code": report.exit_code,
        "memory": _memory_json(report),
        "timings": timings_json(report.timings),
    }


def _order_json(record) -> dict[str, Any]:
    return {"pass": record.pass_name, "changed": record.changed, "method": record.method, "exact": record.exact,
            "reason": record.reason, "seconds": round(record.seconds, 3), "lower_bound_bytes": record.lower_bound,
            "peak_bytes": {rule: {"before": list(before), "after": list(after)}
                           for rule, before, after in zip(record.rules, record.peaks_before, record.peaks_after)}}


def _verification_json(result: VerifyResult) -> dict[str, Any]:
    return {"status": result.status, "passed": result.passed, "reason": result.reason,
            "settings": [dict(s) for s in result.settings], "settings_note": result.settings_note,
            "outputs": [asdict(o) for o in result.outputs]}


def _memory_json(report: Report) -> dict[str, Any] | None:
    audit = report.memory
    if audit is None:
        return None

    def side(p) -> dict[str, Any]:
        return {
            "peak_node": p.peak_node,
            "peak_step": p.peak_step,
            "live_at_peak": [asdict(t) for t in p.live_at_peak],
            "largest": [asdict(t) for t in p.largest],
            "by_op_type": dict(p.by_op_type),
            "unknown_tensors": list(p.unknown_tensors),
            "timeline": list(p.timeline),
            "bodies": [{"node": c.node, "op_type": c.op_type, "counted": c.counted, "reason": c.reason,
                        "body_peak_bytes": c.body_peak, "added_bytes": c.scratch_bytes, "iterations": c.iterations}
                       for c in p.bodies],
        }

    return {
        "peak_bytes": {"before": audit.before.peak_bytes, "after": audit.after.peak_bytes},
        "intermediate_bytes": {"before": audit.before.intermediate_bytes, "after": audit.after.intermediate_bytes},
        "weight_bytes": {"before": audit.before.weight_bytes, "after": audit.after.weight_bytes},
        "unknown_dims": list(audit.unknown_dims),
        "peak_delta_other": audit.peak_delta_other,
        "peak_delta_order": audit.peak_delta_order,
        "peak_bytes_input_order": None if audit.unscheduled is None else audit.unscheduled.peak_bytes,
        "assumed_dims": {name: UNBOUND_DIM for name in report.unbound_dims},
        "before": side(audit.before),
        "after": side(audit.after),
    }


def render_json(report: Report) -> str:
    return json.dumps(to_json_dict(report), indent=2, sort_keys=False) + "\n"


def render_markdown(report: Report) -> str:
    out = [f"### fuse: {markdown(report.model_path)} (target {markdown(report.target)})", ""]
    rows = savings_rows(report)
    if rows:
        out.append("| " + " | ".join(SAVINGS_HEADERS) + " |")
        out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(SAVINGS_HEADERS))) + "|")
        out += ["| " + " | ".join(markdown(c) for c in row) + " |" for row in rows]
    else:
        out.append("No fusion applied.")
    out.append("")
    out += [f"- {markdown(line)}" for line in summary_lines(report) + memory_lines(report)]
    if report.near_misses:
        out += ["", f"<details><summary>Not fused ({len(report.near_misses)})</summary>", "",
                "| Pattern | Nodes | Why not |", "|---|---|---|"]
        out += [f"| {markdown(m.pattern)} | {markdown(' -> '.join(m.nodes))} | {markdown(short_dims_in(m.reason))} |"
                for m in report.near_misses]
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def render_verify_rich(result: VerifyResult, console: Console) -> None:
    title = {MATCH: "outputs match", MISMATCH: "OUTPUTS DIFFER", INCONCLUSIVE: "INCONCLUSIVE",
             UNVERIFIABLE: "UNVERIFIABLE"}[result.status]
    rows = []
    for o in result.outputs:
        verdict = ("ok" if o.passed and not o.all_nonfinite
                   else "all NaN/inf" if o.passed else "[bold red]FAIL[/bold red]")
        # the dtype under the shape, relative beside absolute difference (each over its tolerance):
        # three columns fewer leave the output's name its width at 80 columns
        rows.append((terminal(o.name), f"{'x'.join(map(str, o.shape)) or 'scalar'}\n{o.dtype}",
                     f"{o.max_abs_diff:.3g} / {o.max_rel_diff:.3g}", f"{o.cosine_similarity:.6f}",
                     f"{o.atol:g} / {o.rtol:g}", verdict))
    console.print(fitted_table(VERIFY_COLUMNS, rows, console.width, title=f"fuse verify: {title}"))
    console.print(plain(verdict_line(result)), highlight=False)


def render_verify_json(result: VerifyResult) -> str:
    return json.dumps({"schema_version": SCHEMA_VERSION, "fuse_version": __version__, **_verification_json(result)},
                      indent=2) + "\n"


def render_batch_rich(items, console: Console) -> None:
    """One row per model: what happened, and the headline numbers."""
    rows = []
    for item in items:
        r = item.report
        if r is None:
            rows.append((terminal(item.model), "[bold red]error[/bold red]", "", "", "", terminal(item.error or "")))
            continue
        peak = r["memory"]["peak_bytes"] if r.get("memory") else None
        status = (r.get("verification") or {}).get("status")
        unconfirmed = f" [bold yellow]({status})[/bold yellow]" if status in (UNVERIFIABLE, INCONCLUSIVE) else ""
        rows.append((
            terminal(item.model),
            ("ok" if item.ok else "[bold yellow]check failed[/bold yellow]") + unconfirmed,
            f"{r['nodes']['before']} -> {r['nodes']['after']}",
            human_bytes(sum(f["removed_bytes"] for f in r["fusions"])),
            f"{human_bytes(peak['before'])} -> {human_bytes(peak['after'])}" if peak else "-",
            terminal((item.output or "dry run") if item.ok else "; ".join(r["failures"])),
        ))
    console.print(fitted_table(BATCH_COLUMNS, rows, console.width,
                               title=f"fuse batch: {sum(i.ok for i in items)} of {len(items)} models ok"))


def render_batch_json(items) -> str:
    return json.dumps({"schema_version": SCHEMA_VERSION, "fuse_version": __version__, "models": [
        {"model": i.model, "output": i.output, "exit_code": i.exit_code, "error": i.error, "report": i.report}
        for i in items]}, indent=2) + "\n"


TIMED_PASSES_SHOWN = 15


def timings_json(timings: Timings | None) -> dict[str, Any] | None:
    if timings is None:
        return None
    return {
        "wall_seconds": _seconds(timings.wall_seconds),
        "steps": [{"name": s.name, "within": s.within, "count": s.count, "seconds": _seconds(s.seconds),
                   "peak_rss_bytes": s.peak_rss_bytes} for s in timings.steps],
        "passes": [{"name": p.name, "runs": p.runs, "seconds": _seconds(p.seconds),
                    "matching_seconds": None if p.matching_seconds is None else _seconds(p.matching_seconds),
                    "rewriting_seconds": None if p.rewriting_seconds is None else _seconds(p.rewriting_seconds)}
                   for p in timings.passes],
        "verification": [{"model": v.model, "setting": dict(v.setting), "seconds": _seconds(v.seconds),
                          "at_once": v.at_once} for v in timings.verification],
        "peak_rss_bytes": timings.peak_rss_bytes,
        "worker_peak_rss_bytes": timings.worker_peak_rss_bytes,
    }


def _seconds(value: float) -> float:
    return round(value, 4)


def render_timings(timings: Timings | None, console: Console) -> None:
    """--timings: the steps as a tree (a step's parts under it; the top level adds up to the
    wall time), the slowest passes, and verification's runs by setting."""
    if timings is None:
        return
    worker = (f", onnxruntime's worker {human_bytes(timings.worker_peak_rss_bytes)}"
              if timings.worker_peak_rss_bytes is not None else "")
    console.print(f"Timings: {timings.wall_seconds:.2f} s wall; peak resident memory: fuse "
                  f"{human_bytes(timings.peak_rss_bytes)}{worker}", highlight=False)
    rows = []
    for depth, step in _step_tree(timings):
        share = f"{step.seconds / timings.wall_seconds:.0%}" if step.within is None and timings.wall_seconds else ""
        label = "(beside the run) " + step.name if step.within == BESIDE else step.name
        rows.append((plain("  " * depth + label), str(step.count), f"{step.seconds:.2f}", share,
                     human_bytes(step.peak_rss_bytes)))
    console.print(fitted_table(STEP_COLUMNS, rows, console.width,
                               title="Steps (the top level adds up to the wall time)"))
    if timings.passes:
        slowest = sorted(timings.passes, key=lambda p: -p.seconds)
        rows = [(plain(p.name), str(p.runs), f"{p.seconds:.3f}",
                 *("-" if v is None else f"{v:.3f}" for v in (p.matching_seconds, p.rewriting_seconds)))
                for p in slowest[:TIMED_PASSES_SHOWN]]
        console.print(fitted_table(PASS_TIME_COLUMNS, rows, console.width,
                                   title=f"Passes ({len(slowest)}, slowest first)"))
        if len(slowest) > TIMED_PASSES_SHOWN:
            console.print(f"... and {len(slowest) - TIMED_PASSES_SHOWN} more passes (see --json)", highlight=False)
    if timings.verification:
        rows = []
        for v in timings.verification:
            together = f" (with {v.at_once - 1} more at once)" if v.at_once > 1 else ""
            rows.append((plain(v.model), plain(describe_setting(dict(v.setting)) + together), f"{v.seconds:.2f}"))
        console.print(fitted_table(RUN_TIME_COLUMNS, rows, console.width, title="Verification runs"))


def _step_tree(timings: Timings) -> list[tuple[int, StepTime]]:
    """The steps in the order they first ended, each step's parts under the first row of it."""
    parts: dict[str | None, list[StepTime]] = {}
    for step in timings.steps:
        parts.setdefault(step.within, []).append(step)
    rows: list[tuple[int, StepTime]] = []
    shown: set[str] = set()

    def add(step: StepTime, depth: int) -> None:
        rows.append((depth, step))
        if step.name not in shown:
            shown.add(step.name)
            for part in parts.get(step.name, ()):
                add(part, depth + 1)
    for step in parts.get(None, []) + parts.get(BESIDE, []):
        add(step, 0)
    return rows
