"""Renderers of `fuse bench` results: rich, Markdown, JSON (one rows function for the first two)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.text import Text

from fuse_cli.report.bench_records import BENCH_SCHEMA_VERSION, PEAK_RATIO_FLOOR_BYTES, BenchResult
from fuse_cli.report.render import human_bytes
from fuse_cli.report.table_fit import Column, fitted_table
from fuse_cli.report.text import markdown, plain, terminal

BENCH_HEADERS = ("Provider", "Graph opt", "Model", "Session", "Wall ms median / p90", "CPU ms median / p90",
                 "Runs", "Peak memory", "Wall ×", "CPU ×", "Peak ×", "Session ×")
# The terminal's headers are short, so the table fits 120 columns unwrapped: the run's provider,
# level and model as one label, "median / p90" said once in the summary lines.
BENCH_COLUMNS = (Column("Run"), *(Column(h, figure=True) for h in
                                  ("Session", "Wall ms", "CPU ms", "Runs", "Peak", *BENCH_HEADERS[8:])))


def bench_table_rows(result: BenchResult) -> list[tuple[str, ...]]:
    return [(
        r.provider, r.graph_optimization, r.model, f"{r.session_ms:.1f} ms",
        f"{_ms(r.wall_median_ms)} / {_ms(r.wall_p90_ms)}", f"{_ms(r.cpu_median_ms)} / {_ms(r.cpu_p90_ms)}",
        f"{r.samples}x{r.runs_per_sample}", "-" if r.peak_bytes is None else human_bytes(r.peak_bytes),
        _times(r.wall_ratio), _times(r.cpu_ratio), _times(r.peak_ratio), _times(r.session_ratio),
    ) for r in result.rows]


def bench_summary_lines(result: BenchResult) -> list[str]:
    shapes = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'}" for name, shape in result.input_shapes)
    lines = [
        f"Fused model: {result.fused_by}; nodes {result.nodes_original} -> {result.nodes_fused}",
        f"Inputs (seed {result.seed}): {shapes or 'none'}",
        "Runs: samples x runs per sample, after warm-up, one intra-op thread; wall and CPU ms: median / p90 per "
        f"run; CPU = the calling thread's CPU time; onnxruntime {result.onnxruntime_version}. Ratios: fused / "
        "original (below 1 is better).",
    ]
    if result.peak_not_measured:
        lines.append(f"Peak memory not measured: {result.peak_not_measured}")
    elif result.peak_method:
        lines.append(f"Peak memory (CPU, graph optimizations disabled): {result.peak_method} No ratio "
                     f"below {human_bytes(PEAK_RATIO_FLOOR_BYTES)}: the measurement's noise is tens of pages.")
    lines += [f"{provider} not benchmarked: {reason}" for provider, reason in result.skipped_providers]
    return lines


def render_bench_rich(result: BenchResult, console: Console) -> None:
    rows = bench_table_rows(result)
    cells = [(Text.assemble(plain(f"{row[0]}, {row[1]}"), "\n", plain(row[2])), *map(plain, row[3:])) for row in rows]
    sections = [i + 1 < len(rows) and rows[i + 1][:2] != row[:2] for i, row in enumerate(rows)]
    console.print(fitted_table(BENCH_COLUMNS, cells, console.width, title=f"fuse bench: {terminal(result.original)}",
                               sections=sections))
    for line in bench_summary_lines(result):
        console.print(plain(line), highlight=False)


def render_bench_markdown(result: BenchResult) -> str:
    out = [f"### fuse bench: {markdown(result.original)}", "",
           "| " + " | ".join(BENCH_HEADERS) + " |",
           "|" + "|".join("---" if i < 3 else "---:" for i in range(len(BENCH_HEADERS))) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in bench_table_rows(result)]
    out += [""] + [f"- {markdown(line)}" for line in bench_summary_lines(result)]
    return "\n".join(out) + "\n"


def bench_to_json_dict(result: BenchResult) -> dict[str, Any]:
    return {
        "schema_version": BENCH_SCHEMA_VERSION,
        "tool": "fuse bench",
        "original": result.original,
        "optimized": result.optimized,
        "fused_by": result.fused_by,
        "nodes": {"original": result.nodes_original, "fused": result.nodes_fused},
        "input_shapes": {name: list(shape) for name, shape in result.input_shapes},
        "seed": result.seed,
        "onnxruntime_version": result.onnxruntime_version,
        "threads": {"intra_op": 1, "inter_op": 1},
        "timing": asdict(result.timing),
        "rows": [asdict(r) for r in result.rows],
        "skipped_providers": [{"provider": p, "reason": r} for p, r in result.skipped_providers],
        "peak_memory": {"method": result.peak_method, "not_measured": result.peak_not_measured},
    }


def render_bench_json(result: BenchResult) -> str:
    return json.dumps(bench_to_json_dict(result), indent=2) + "\n"


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
