"""fuse against its peers, on the bundled samples, the onnx package's light model zoo and your own
models: node count, optimize time and memory, latency, peak activation memory and output error.

    make bench                                   # writes benchmarks/results/latest.md and .json
    MODELS=/path/to/folder make bench            # adds every *.onnx in that folder
    .venv/bin/python benchmarks/run.py [--quick] [--out DIR] [--tools fuse-onnx,onnxslim]
                                       [--dim NAME=VALUE] [MODEL.onnx ...]

Every optimizer runs in a child process of its own (file in, file out, imports excluded from the
time), so a crash or a hang costs one cell, and the child's VmHWM is that optimizer's memory.
A peer that does not import is skipped, with the reason, in the tables. Every model is then run
with onnxruntime's graph optimizations disabled (the graph as written), on CPU with one thread,
by fuse_cli.bench: latency and peak activation memory as ratios to the original, and the largest
absolute output difference from the original on the same seeded inputs. The "noise floor" row is
the original against a second session of itself: ratios that far from 1 mean nothing.
See benchmarks/README.md for the fields of the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import onnx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from fuse_cli.analysis.measure import measure_peak  # noqa: E402
from fuse_cli.bench import (PEAK_RATIO_FLOOR_BYTES, QUICK, Latency, Timing, feeds_for, make_session,  # noqa: E402
                            peak_ratio, random_inputs_for, ratio, time_sessions)
from fuse_cli.errors import FuseError  # noqa: E402
from fuse_cli.report.render import human_bytes  # noqa: E402
from fuse_cli.verify import compare_outputs, run as run_session  # noqa: E402

SCHEMA_VERSION = 1
SAMPLES = REPO / "sample_models"
LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
DEFAULT_OUT = REPO / "benchmarks" / "results"
DEFAULT_DIMS = {"batch": 8, "sequence": 128}
# Enough for stable medians of the light models in a ~5-minute run on two cores.
DEFAULT_TIMING = Timing(warmup_runs=2, warmup_seconds=0.1, min_samples=7, max_samples=60, min_seconds=0.3,
                        sample_seconds=0.005, session_repeats=1, peak_repeats=2)
OPTIMIZE_TIMEOUT_S = 600
NOISE = "noise-floor"
RESULT_MARK = "RESULT "


@dataclass(frozen=True)
class Tool:
    name: str
    label: str
    module: str  # what must import for the tool to run
    distribution: str  # whose version to report


TOOLS = (
    Tool("fuse-onnx", "fuse --target onnx", "fuse_cli", "fuse-cli"),
    Tool("fuse-ort-cpu", "fuse --target ort-cpu", "fuse_cli", "fuse-cli"),
    Tool("onnxoptimizer", "onnxoptimizer, its fuse and elimination passes", "onnxoptimizer", "onnxoptimizer"),
    Tool("onnxslim", "onnxslim, defaults", "onnxslim", "onnxslim"),
    Tool("onnxsim", "onnx-simplifier, defaults", "onnxsim", "onnxsim"),
    Tool("ort-basic", "onnxruntime offline, ORT_ENABLE_BASIC", "onnxruntime", "onnxruntime-gpu"),
    Tool("ort-extended", "onnxruntime offline, ORT_ENABLE_EXTENDED", "onnxruntime", "onnxruntime-gpu"),
)
TOOL_NAMES = tuple(t.name for t in TOOLS)


# ---- the child: one optimizer, file to file ----------------------------------------------------

def optimize_here(tool: str, source: str, destination: str) -> dict[str, Any]:
    """Run one optimizer in this (fresh) process: {"seconds", "rss_before_bytes",
    "peak_rss_bytes"} or {"error"}. Imports come first, outside the time and the RSS baseline."""
    import onnxruntime as ort  # noqa: F401 - in every child's baseline, since fuse and onnxsim load it

    def load():
        return onnx.load(source)

    if tool.startswith("fuse-"):
        from fuse_cli import api
        from fuse_cli.config import FuseConfig

        def work():
            api.optimize(source, FuseConfig(target=tool.removeprefix("fuse-")), destination)
    elif tool == "onnxoptimizer":
        import onnxoptimizer

        def work():
            onnx.save(onnxoptimizer.optimize(load()), destination)
    elif tool == "onnxslim":
        import onnxslim

        def work():
            onnx.save(onnxslim.slim(load()), destination)
    elif tool == "onnxsim":
        import onnxsim

        def work():
            model, _ = onnxsim.simplify(load())
            onnx.save(model, destination)
    elif tool in ("ort-basic", "ort-extended"):
        level = "ORT_ENABLE_BASIC" if tool == "ort-basic" else "ORT_ENABLE_EXTENDED"

        def work():
            options = ort.SessionOptions()
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
            options.optimized_model_filepath = destination
            options.intra_op_num_threads = 1
            options.log_severity_level = 3
            ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    else:
        return {"error": f"unknown tool {tool!r}"}
    rss_before = _reset_high_water_mark()
    start = time.perf_counter()
    try:
        # Peers print progress; stdout carries this child's result line.
        with contextlib.redirect_stdout(sys.stderr):
            work()
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is a result, not a crash
        return {"error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"}
    seconds = time.perf_counter() - start
    if not Path(destination).is_file():
        return {"error": "wrote no model"}
    return {"seconds": seconds, "rss_before_bytes": rss_before, "peak_rss_bytes": _status_bytes("VmHWM")}


def _reset_high_water_mark() -> int | None:
    """RSS now, with VmHWM reset to it where Linux allows, so VmHWM afterwards is the work's peak.
    Not ru_maxrss: Linux carries it across fork and exec, so a child of a large parent would
    report the parent's size."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # VmHWM then also covers the imports: an over-estimate, never an under-estimate
    return _status_bytes("VmRSS")


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration):
        return None


def optimize_in_child(tool: str, source: Path, destination: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "ORT_LOGGING_LEVEL": "3"}
    # Each optimizer runs in a scratch folder: some write temporary models into the working
    # directory (onnxruntime's symbolic shape inference leaves sym_shape_infer_temp.onnx there).
    try:
        with tempfile.TemporaryDirectory(prefix="fuse-bench-cwd-") as scratch:
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--optimize-child", tool,
                                   str(source.resolve()), str(destination.resolve())],
                                  capture_output=True, text=True, env=env, timeout=OPTIMIZE_TIMEOUT_S, check=False,
                                  cwd=scratch)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {OPTIMIZE_TIMEOUT_S} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"error": f"the optimizer's process died: {tail[:300]}"}


# ---- results ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolStatus:
    name: str
    label: str
    version: str | None
    skipped: str | None  # why the tool did not run at all


@dataclass(frozen=True)
class ToolResult:
    tool: str
    nodes: int | None = None
    optimize_seconds: float | None = None
    optimizer_peak_rss_bytes: int | None = None     # the child's VmHWM: interpreter, imports and the work
    optimizer_rss_growth_bytes: int | None = None   # VmHWM (reset after the imports) minus RSS then: the work
    latency: Latency | None = None
    cpu_ratio: float | None = None
    wall_ratio: float | None = None
    peak_bytes: int | None = None
    peak_ratio: float | None = None
    node_ratio: float | None = None
    max_abs_diff: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class ModelResult:
    name: str
    path: str
    group: str
    nodes: int
    input_shapes: Mapping[str, tuple[int, ...]]
    latency: Latency | None
    peak_bytes: int | None
    results: tuple[ToolResult, ...]
    error: str | None = None


GROUPS = ("CNN with BatchNorm", "CNN without BatchNorm", "transformer", "MLP / other")


def model_group(model: onnx.ModelProto) -> str:
    ops = {n.op_type for n in model.graph.node}
    if ops & {"LayerNormalization", "Attention", "MultiHeadAttention", "SkipLayerNormalization"} or \
            {"MatMul", "Softmax"} <= ops:
        return "transformer"
    if ops & {"Conv", "ConvTranspose"}:
        return "CNN with BatchNorm" if "BatchNormalization" in ops else "CNN without BatchNorm"
    return "MLP / other"


def tool_statuses(names: Sequence[str]) -> list[ToolStatus]:
    statuses = []
    for tool in (t for t in TOOLS if t.name in names):
        try:
            importlib.import_module(tool.module)
            skipped = None
        except Exception as exc:  # noqa: BLE001 - an ImportError or a broken extension module alike
            skipped = f"does not import ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
        try:
            version = importlib.metadata.version(tool.distribution)
        except importlib.metadata.PackageNotFoundError:
            version = None
        statuses.append(ToolStatus(tool.name, tool.label, version, skipped))
    return statuses


def bench_model(path: Path, tools: Sequence[str], dims: Mapping[str, int], timing: Timing, console: Console,
                seed: int = 0) -> ModelResult:
    original = onnx.load(str(path), load_external_data=False)
    name, group, nodes = path.stem, model_group(original), len(original.graph.node)
    del original
    with tempfile.TemporaryDirectory(prefix="fuse-run-") as tmp:
        outputs: dict[str, Path] = {}
        results: dict[str, ToolResult] = {}
        for tool in tools:
            console.print(f"  {name}: {tool}", highlight=False)
            destination = Path(tmp) / f"{tool}.onnx"
            done = optimize_in_child(tool, path, destination)
            if "error" in done:
                results[tool] = ToolResult(tool, error=done["error"])
                continue
            count = len(onnx.load(str(destination), load_external_data=False).graph.node)
            peak, before = done["peak_rss_bytes"], done["rss_before_bytes"]
            growth = peak - before if peak is not None and before is not None else None
            results[tool] = ToolResult(tool, nodes=count, optimize_seconds=done["seconds"],
                                       optimizer_peak_rss_bytes=done["peak_rss_bytes"],
                                       optimizer_rss_growth_bytes=growth, node_ratio=ratio(count, nodes))
            outputs[tool] = destination
        try:
            return _run_models(path, name, group, nodes, outputs, results, tools, dims, timing, seed)
        except FuseError as exc:
            return ModelResult(name, str(path), group, nodes, {}, None, None, tuple(results.values()), str(exc))


def _run_models(path: Path, name: str, group: str, nodes: int, outputs: dict[str, Path],
                results: dict[str, ToolResult], tools: Sequence[str], dims: Mapping[str, int], timing: Timing,
                seed: int) -> ModelResult:
    """Latency, output difference and peak memory of the original, itself again, and each output."""
    reference = make_session(path)
    feeds = random_inputs_for(reference, dims=dims, seed=seed)
    expected = run_session(reference, feeds)
    sessions = {"original": reference, NOISE: make_session(path)}
    for tool, output in list(outputs.items()):
        try:
            sessions[tool] = make_session(output)
            got = run_session(sessions[tool], feeds_for(sessions[tool], feeds, dims=dims, seed=seed))
            worst = max((o.max_abs_diff for o in compare_outputs(expected, got).outputs), default=0.0)
            results[tool] = replace(results[tool], max_abs_diff=worst)
        except FuseError as exc:
            sessions.pop(tool, None)
            outputs.pop(tool)
            results[tool] = replace(results[tool], error=str(exc))
    latencies = time_sessions(sessions, {n: feeds_for(s, feeds, dims=dims, seed=seed) for n, s in sessions.items()},
                              timing)
    del sessions, reference
    shapes = {k: tuple(int(d) for d in v.shape) for k, v in feeds.items()}

    def peak(model_path: Path) -> int | None:
        try:
            return measure_peak(model_path, dims=dims, input_shapes=shapes, seed=seed,
                                repeats=timing.peak_repeats).peak_bytes
        except (ValueError, FuseError):
            return None

    base = latencies["original"]
    base_peak = peak(path)
    rows = [ToolResult(NOISE, nodes=nodes, node_ratio=1.0, max_abs_diff=0.0)] + [results[t] for t in tools]
    finished = []
    for row in rows:
        lat = latencies.get(row.tool)
        if lat is None:
            finished.append(row)
            continue
        measured = peak(path if row.tool == NOISE else outputs[row.tool])
        finished.append(replace(row, latency=lat, cpu_ratio=ratio(lat.cpu_median_ms, base.cpu_median_ms),
                                wall_ratio=ratio(lat.wall_median_ms, base.wall_median_ms),
                                peak_bytes=measured, peak_ratio=peak_ratio(measured, base_peak)))
    return ModelResult(name, str(path), group, nodes, shapes, base, base_peak, tuple(finished))


# ---- geometric means by group ------------------------------------------------------------------

@dataclass(frozen=True)
class GroupMean:
    group: str
    tool: str
    models: int
    node_ratio: float | None
    cpu_ratio: float | None
    wall_ratio: float | None
    peak_ratio: float | None


def group_means(models: Sequence[ModelResult], tools: Sequence[str]) -> list[GroupMean]:
    means = []
    for group in (*GROUPS, "all"):
        members = [m for m in models if group in ("all", m.group)]
        if not members:
            continue
        for tool in (NOISE, *tools):
            rows = [r for m in members for r in m.results if r.tool == tool and r.error is None]
            if rows:
                means.append(GroupMean(group, tool, len(rows), *(_geomean([getattr(r, field) for r in rows])
                                       for field in ("node_ratio", "cpu_ratio", "wall_ratio", "peak_ratio"))))
    return means


def _geomean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in present) / len(present)) if present else None


# ---- rendering: rich and Markdown share the rows functions --------------------------------------

HEADERS = ("Model", "Tool", "Nodes", "Optimize", "Opt. RSS +", "CPU time", "Wall time", "Peak memory", "Max abs diff")
GROUP_HEADERS = ("Group", "Tool", "Models", "Nodes ×", "CPU time ×", "Wall time ×", "Peak memory ×")


def table_rows(models: Sequence[ModelResult]) -> list[list[tuple[str, ...]]]:
    """One block per model: the original (absolute figures) then each tool (ratios to it)."""
    blocks = []
    for m in models:
        lat = m.latency
        block = [(m.name, "original", str(m.nodes), "-", "-",
                  f"{lat.cpu_median_ms:.2f} ms" if lat else "-", f"{lat.wall_median_ms:.2f} ms" if lat else "-",
                  human_bytes(m.peak_bytes) if m.peak_bytes is not None else "-", m.error or "-")]
        for r in m.results:
            if r.error is not None and r.latency is None:
                block.append(("", r.tool, _int(r.nodes), _seconds(r.optimize_seconds),
                              _bytes(r.optimizer_rss_growth_bytes), "failed", "", "", r.error))
                continue
            block.append(("", r.tool, _int(r.nodes), _seconds(r.optimize_seconds), _bytes(r.optimizer_rss_growth_bytes),
                          _times(r.cpu_ratio), _times(r.wall_ratio), _peak(r), _diff(r.max_abs_diff)))
        blocks.append(block)
    return blocks


def group_rows(means: Sequence[GroupMean]) -> list[tuple[str, ...]]:
    return [(g.group, g.tool, str(g.models), _times(g.node_ratio), _times(g.cpu_ratio), _times(g.wall_ratio),
             _times(g.peak_ratio)) for g in means]


def _peak(r: ToolResult) -> str:
    """The ratio, or the bytes where the original's peak is too small for one to mean anything."""
    if r.peak_ratio is not None or r.peak_bytes is None:
        return _times(r.peak_ratio)
    return human_bytes(r.peak_bytes)


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _bytes(value: int | None) -> str:
    return "-" if value is None else human_bytes(max(value, 0))


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _diff(value: float | None) -> str:
    return "-" if value is None else "0" if value == 0 else f"{value:.2g}"


def render_rich(run: Mapping[str, Any], models: Sequence[ModelResult], means: Sequence[GroupMean],
                console: Console) -> None:
    table = Table(title="fuse and its peers (CPU, 1 thread, onnxruntime graph optimizations disabled; "
                        "tool rows are ratios to the original)", title_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i < 2 or i == len(HEADERS) - 1 else "right",
                         overflow="fold", max_width=40 if i == len(HEADERS) - 1 else None)
    for block in table_rows(models):
        for i, row in enumerate(block):
            table.add_row(*row, end_section=i == len(block) - 1)
    console.print(table)
    groups = Table(title="Geometric means by group", title_justify="left")
    for i, header in enumerate(GROUP_HEADERS):
        groups.add_column(header, justify="left" if i < 2 else "right")
    for row in group_rows(means):
        groups.add_row(*row)
    console.print(groups)
    for line in notes(run):
        console.print(line, highlight=False)


def render_markdown(run: Mapping[str, Any], models: Sequence[ModelResult], means: Sequence[GroupMean]) -> str:
    out = ["# fuse and its peers", "",
           f"{run['created']} on {run['machine']['platform']}, {run['machine']['cpu_count']} CPUs, Python "
           f"{run['machine']['python']}, onnx {run['machine']['onnx']}, onnxruntime {run['machine']['onnxruntime']}"
           f"{' (quick run: timings not worth comparing)' if run['settings']['quick'] else ''}.", "",
           "CPU, one thread, onnxruntime graph optimizations disabled. Original rows: absolute figures; tool rows: "
           "ratios to the original (below 1 is better).", "",
           _md_table(HEADERS, [row for block in table_rows(models) for row in block]), "",
           "## Geometric means by group", "", _md_table(GROUP_HEADERS, group_rows(means)), "", "## Tools", ""]
    for tool in run["tools"]:
        state = f"skipped: {tool['skipped']}" if tool["skipped"] else "ran"
        out.append(f"- `{tool['name']}` ({tool['label']}), version {tool['version'] or 'unknown'}: {state}")
    out += ["", "## How it was measured", ""] + [f"- {line}" for line in notes(run)]
    return "\n".join(out) + "\n"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def notes(run: Mapping[str, Any]) -> list[str]:
    timing = run["settings"]["timing"]
    lines = [
        "Optimize: wall time of one run of the optimizer, file to file, in a child process, imports excluded "
        "(fuse's includes its own check of the outputs in onnxruntime). Opt. RSS +: that child's peak RSS "
        "(VmHWM, reset through /proc/self/clear_refs after the imports) above its RSS then.",
        f"CPU time / Wall time: median per-run time of the calling thread's CPU / of the clock, the sessions "
        f"timed in alternating rounds (at least {timing['min_samples']}, at most {timing['max_samples']} samples "
        f"after warm-up). `noise-floor` is the original against a second session of itself.",
        f"Peak memory: {run['peak_method']} Where the original's peak is under "
        f"{human_bytes(PEAK_RATIO_FLOOR_BYTES)} the tool rows give bytes, not a ratio: the measurement's noise "
        "is tens of pages.",
        "Max abs diff: largest absolute difference from the original's outputs on the same seeded random inputs "
        f"(symbolic dims: {', '.join(f'{k}={v}' for k, v in run['settings']['dims'].items())}, others 1).",
        "The light models build most weights at run time from ConstantOfShape: a tool that folds them into "
        "initializers lowers the measured peak activation memory by the weights' size.",
    ]
    return lines


def to_json(run: Mapping[str, Any], models: Sequence[ModelResult], means: Sequence[GroupMean]) -> dict[str, Any]:
    def tool_json(r: ToolResult) -> dict[str, Any]:
        data = asdict(r)
        data["latency"] = _latency_json(r.latency)
        return data

    return {
        **run,
        "models": [{
            "name": m.name, "path": _shown_path(m.path), "group": m.group, "nodes": m.nodes,
            "input_shapes": {k: list(v) for k, v in m.input_shapes.items()},
            "latency": _latency_json(m.latency), "peak_bytes": m.peak_bytes, "error": m.error,
            "results": [tool_json(r) for r in m.results],
        } for m in models],
        "groups": [asdict(g) for g in means],
    }


def _shown_path(path: str) -> str:
    """Relative to the repository where the model lies inside it, so result files can be kept."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else path


def _latency_json(lat: Latency | None) -> dict[str, Any] | None:
    return None if lat is None else {**asdict(lat), "runs": lat.runs}


# ---- the run ------------------------------------------------------------------------------------

def default_models() -> list[Path]:
    models = sorted(SAMPLES.glob("*.onnx")) + sorted(LIGHT_MODELS.glob("*.onnx"))
    if os.environ.get("MODELS"):
        folder = Path(os.environ["MODELS"])
        if not folder.is_dir():
            raise SystemExit(f"run.py: MODELS={folder} is not a folder")
        models += sorted(folder.glob("*.onnx"))
    return models


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, help="models to run (default: samples, light zoo, $MODELS)")
    parser.add_argument("--quick", action="store_true", help="few timing runs (for tests; figures not comparable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for latest.md and latest.json")
    parser.add_argument("--tools", default=",".join(TOOL_NAMES), help=f"comma-separated, from {', '.join(TOOL_NAMES)}")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help=f"bind a symbolic dim (default {', '.join(f'{k}={v}' for k, v in DEFAULT_DIMS.items())})")
    parser.add_argument("--optimize-child", nargs=3, metavar=("TOOL", "SOURCE", "DESTINATION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.tools.split(",")) - set(TOOL_NAMES))
    if unknown:
        parser.error(f"unknown tool {unknown[0]!r}; choose from {', '.join(TOOL_NAMES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.optimize_child:
        print(RESULT_MARK + json.dumps(optimize_here(*args.optimize_child)))
        return 0
    import onnxruntime as ort

    dims = dict(DEFAULT_DIMS)
    for item in args.dim:
        key, _, value = item.partition("=")
        dims[key] = int(value)
    timing = QUICK if args.quick else DEFAULT_TIMING
    models = args.models or default_models()
    progress = Console(stderr=True)
    statuses = tool_statuses(args.tools.split(","))
    tools = [s.name for s in statuses if s.skipped is None]
    for s in statuses:
        if s.skipped:
            progress.print(f"skipping {s.name}: {s.skipped}", highlight=False)
    started = time.perf_counter()
    results = []
    for path in models:
        progress.print(f"{path.name} ...", highlight=False)
        results.append(bench_model(path, tools, dims, timing, progress))
    means = group_means(results, tools)
    run = {
        "schema_version": SCHEMA_VERSION,
        "tool": "benchmarks/run.py",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpu_count": os.cpu_count(), "onnx": onnx.__version__, "onnxruntime": ort.__version__},
        "settings": {"quick": args.quick, "dims": dims, "seed": 0, "provider": "CPU", "threads": 1,
                     "graph_optimization": "disabled", "timing": asdict(timing)},
        "peak_method": measure_method(timing),
        "tools": [asdict(s) for s in statuses],
    }
    render_rich(run, results, means, Console(width=160))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.md").write_text(render_markdown(run, results, means), encoding="utf-8")
    (args.out / "latest.json").write_text(json.dumps(to_json(run, results, means), indent=2) + "\n", encoding="utf-8")
    progress.print(f"Wrote {args.out / 'latest.md'} and {args.out / 'latest.json'} in {run['seconds']} s",
                   highlight=False)
    return 0


def measure_method(timing: Timing) -> str:
    from fuse_cli.analysis.measure import method_sentence

    return method_sentence(timing.peak_repeats)


if __name__ == "__main__":
    sys.exit(main())
