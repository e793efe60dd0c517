"""fuse against its peers, on the bundled samples, the onnx package's light model zoo and your own
models: node count, optimize time and memory, session-creation time, latency, peak activation memory
and output error.

    make bench                                   # writes benchmarks/results/latest.md and .json
    MODELS=/path/to/folder make bench            # adds every *.onnx in that folder
    .venv/bin/python benchmarks/run.py [--quick] [--out DIR] [--tools fuse-onnx,onnxslim]
                                       [--dim NAME=VALUE] [MODEL.onnx ...]

Every optimizer runs in a child process of its own (file in, file out, imports excluded from the
time), so a crash or a hang costs one cell, and the child's VmHWM is that optimizer's memory.
A peer that does not import is skipped, with the reason, in the tables. Every model is then run
on CPU with one thread, by fuse_cli.bench, at two onnxruntime graph-optimization levels: `disabled`
(the graph as written: what the tool's rewrite changed) and `all` (ORT_ENABLE_ALL, onnxruntime's
default: what a user gets). Reported as ratios to the original: latency at both levels, the time
to create a session from the file at `all`, and peak activation memory at `disabled`; and the
largest absolute output difference from the original on the same seeded inputs. The "noise floor"
row is the original against a second session of itself: ratios that far from 1 mean nothing.
Models are grouped by their operators and opset (GROUPS); a model can count in two groups.
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
from fuse_cli.input_domain import integer_ranges  # noqa: E402
from fuse_cli.report.render import human_bytes  # noqa: E402
from fuse_cli.verify import compare_outputs, run as run_session  # noqa: E402

SCHEMA_VERSION = 2
SAMPLES = REPO / "sample_models"
LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
DEFAULT_OUT = REPO / "benchmarks" / "results"
DEFAULT_DIMS = {"batch": 8, "sequence": 128}
# Transformers run at batch 1, as they are served (and a BERT-base run at batch 8 takes ~1.4 s on
# one thread: the corpus would take hours); --dim overrides both.
TRANSFORMER_DIMS = {"batch": 1, "sequence": 128}
# onnxruntime graph-optimization levels, named as in fuse_cli.bench: ORT_DISABLE_ALL, ORT_ENABLE_ALL.
# Session creation is timed at `all`, where onnxruntime's optimizer runs, as it does for a user.
LEVELS = ("disabled", "all")
# Enough for stable medians of the light models in a ~5-minute run on two cores. `all` gets fewer
# samples, so the second level adds about a sixth to the run, not a half. `all` times session creation
# (session_repeats) and `disabled` measures peak memory (peak_repeats): each uses one of the two.
DEFAULT_TIMING = {
    "disabled": Timing(warmup_runs=2, warmup_seconds=0.1, min_samples=7, max_samples=60, min_seconds=0.3,
                       sample_seconds=0.005, session_repeats=1, peak_repeats=2),
    "all": Timing(warmup_runs=1, warmup_seconds=0.05, min_samples=5, max_samples=30, min_seconds=0.15,
                  sample_seconds=0.005, session_repeats=3, peak_repeats=1),
}
QUICK_TIMING = dict.fromkeys(LEVELS, QUICK)
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
    """One tool's output of one model, or the noise-floor row. Ratios are over the original's figure."""
    tool: str
    nodes: int | None = None
    node_ratio: float | None = None
    optimize_seconds: float | None = None
    optimizer_peak_rss_bytes: int | None = None     # the child's VmHWM: interpreter, imports and the work
    optimizer_rss_growth_bytes: int | None = None   # VmHWM (reset after the imports) minus RSS then: the work
    session_ms: float | None = None                 # the smallest creation time from the file, at `all`
    session_ratio: float | None = None
    latency_disabled: Latency | None = None
    cpu_ratio_disabled: float | None = None
    wall_ratio_disabled: float | None = None
    latency_all: Latency | None = None
    cpu_ratio_all: float | None = None
    wall_ratio_all: float | None = None
    peak_bytes: int | None = None                   # measured at `disabled` only
    peak_ratio: float | None = None
    max_abs_diff: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class ModelResult:
    name: str
    path: str
    groups: tuple[str, ...]
    nodes: int
    input_shapes: Mapping[str, tuple[int, ...]]
    session_ms: float | None
    latency_disabled: Latency | None
    latency_all: Latency | None
    peak_bytes: int | None
    results: tuple[ToolResult, ...]
    error: str | None = None


# ---- groups: by operators (each model in exactly one), plus CNNs at opset 14 -------------------

@dataclass(frozen=True)
class Group:
    name: str
    rule: str  # who is in it, in words, printed beside its members


ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
GROUPS = (
    Group("CNN with BatchNorm", "Conv or ConvTranspose and BatchNormalization; no attention"),
    Group("CNN without BatchNorm", "Conv or ConvTranspose, no BatchNormalization; no attention"),
    Group("CNN opset 14", "a model of either CNN group whose default-domain opset import is 14"),
    Group("transformer", f"attention: MatMul and Softmax, or {', '.join(ATTENTION_OPS)}"),
    Group("MLP / other", "none of the above"),
)
ALL = "all"


def model_groups(model: onnx.ModelProto) -> tuple[str, ...]:
    """The groups `model` counts in, in GROUPS order: one by its operators, and CNN opset 14 too
    for a CNN at opset 14. Attention makes a transformer, LayerNormalization does not: ConvNeXt
    has LayerNormalization (from opset 17) and is a CNN at every opset."""
    ops = {n.op_type for n in model.graph.node}
    if ops & set(ATTENTION_OPS) or {"MatMul", "Softmax"} <= ops:
        return ("transformer",)
    if not ops & {"Conv", "ConvTranspose"}:
        return ("MLP / other",)
    by_ops = "CNN with BatchNorm" if "BatchNormalization" in ops else "CNN without BatchNorm"
    return (by_ops, "CNN opset 14") if default_opset(model) == 14 else (by_ops,)


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


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


# ---- one model: optimize with every tool, then measure everything ------------------------------

def bench_model(path: Path, tools: Sequence[str], dims: Mapping[str, int], timing: Mapping[str, Timing],
                console: Console, seed: int = 0) -> ModelResult:
    original = onnx.load(str(path), load_external_data=False)
    name, groups, nodes = path.stem, model_groups(original), len(original.graph.node)
    del original
    dims = {**(TRANSFORMER_DIMS if "transformer" in groups else DEFAULT_DIMS), **dims}
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
        console.print(f"  {name}: onnxruntime, both levels", highlight=False)
        try:
            return _run_models(path, name, groups, nodes, outputs, results, tools, dims, timing, seed)
        except FuseError as exc:
            return ModelResult(name, str(path), groups, nodes, input_shapes={}, session_ms=None, latency_disabled=None,
                               latency_all=None, peak_bytes=None, results=tuple(results.values()), error=str(exc))


def _run_models(path: Path, name: str, groups: tuple[str, ...], nodes: int, outputs: dict[str, Path],
                results: dict[str, ToolResult], tools: Sequence[str], dims: Mapping[str, int],
                timing: Mapping[str, Timing], seed: int) -> ModelResult:
    """Output difference, latency at both levels, session creation and peak memory of the
    original, itself again (the noise floor) and each tool's output."""
    reference = make_session(path)
    # integers in the ranges the graph implies (an embedding's rows), as fuse's verification feeds
    # them: BERT's token_type_ids at 0..9 index past its two rows and the run fails
    ranges = integer_ranges(onnx.load(str(path), load_external_data=False))
    feeds = random_inputs_for(reference, dims=dims, seed=seed, int_ranges=ranges)
    expected = run_session(reference, feeds)
    sessions = {"original": reference, NOISE: make_session(path)}
    for tool, output in list(outputs.items()):
        try:
            sessions[tool] = make_session(output)
            got = run_session(sessions[tool], feeds_for(sessions[tool], feeds, dims=dims, seed=seed, int_ranges=ranges))
            worst = max((o.max_abs_diff for o in compare_outputs(expected, got).outputs), default=0.0)
            results[tool] = replace(results[tool], max_abs_diff=worst)
        except FuseError as exc:
            sessions.pop(tool, None)
            outputs.pop(tool)
            results[tool] = replace(results[tool], error=str(exc))

    def time_all(sessions: Mapping[str, Any], level: str) -> dict[str, Latency]:
        return time_sessions(sessions,
                             {n: feeds_for(s, feeds, dims=dims, seed=seed, int_ranges=ranges)
                              for n, s in sessions.items()},
                             timing[level]) if sessions else {}

    latencies = {"disabled": time_all(sessions, "disabled")}
    del sessions, reference  # one level's sessions in memory at a time
    sessions, session_ms, refused = timed_sessions({"original": path, NOISE: path, **outputs}, "all",
                                                   timing["all"].session_repeats)
    model_error = None
    if "original" in refused:  # onnxruntime's optimizer failing on the original: keep `disabled`
        model_error = f"at ORT_ENABLE_ALL: {refused.pop('original')}"
        sessions, session_ms = {}, {}
    for tool, reason in refused.items():
        if tool in results:
            results[tool] = replace(results[tool], error=f"at ORT_ENABLE_ALL: {reason}")
    latencies["all"] = time_all(sessions, "all")
    del sessions
    shapes = {k: tuple(int(d) for d in v.shape) for k, v in feeds.items()}

    def peak(model_path: Path) -> int | None:
        try:
            return measure_peak(model_path, dims=dims, input_shapes=shapes, seed=seed, int_ranges=ranges,
                                repeats=timing["disabled"].peak_repeats).peak_bytes
        except (ValueError, FuseError):
            return None

    base = {level: latencies[level].get("original") for level in LEVELS}
    base_peak = peak(path)
    rows = [ToolResult(NOISE, nodes=nodes, node_ratio=1.0, max_abs_diff=0.0)] + [results[t] for t in tools]
    finished = []
    for row in rows:
        disabled, full = latencies["disabled"].get(row.tool), latencies["all"].get(row.tool)
        if disabled is None:
            finished.append(row)
            continue
        cpu_disabled, wall_disabled = _latency_ratios(disabled, base["disabled"])
        cpu_all, wall_all = _latency_ratios(full, base["all"])
        measured = peak(path if row.tool == NOISE else outputs[row.tool])
        finished.append(replace(
            row, session_ms=session_ms.get(row.tool), session_ratio=ratio(session_ms.get(row.tool),
                                                                          session_ms.get("original")),
            latency_disabled=disabled, cpu_ratio_disabled=cpu_disabled, wall_ratio_disabled=wall_disabled,
            latency_all=full, cpu_ratio_all=cpu_all, wall_ratio_all=wall_all,
            peak_bytes=measured, peak_ratio=peak_ratio(measured, base_peak)))
    return ModelResult(name, str(path), groups, nodes, shapes, session_ms=session_ms.get("original"),
                       latency_disabled=base["disabled"], latency_all=base["all"], peak_bytes=base_peak,
                       results=tuple(finished), error=model_error)


def timed_sessions(paths: Mapping[str, Path], level: str,
                   repeats: int) -> tuple[dict[str, Any], dict[str, float], dict[str, str]]:
    """(sessions at `level`, the smallest of `repeats` creation times from the file in ms, why a
    model would not load). The creations go in alternating rounds, the order rotating, so a burst
    of load hits every model alike; the smallest is the one least disturbed by it."""
    names = list(paths)
    sessions: dict[str, Any] = {}
    best: dict[str, float] = {}
    refused: dict[str, str] = {}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            if name in refused:
                continue
            sessions.pop(name, None)  # freed before its next creation, not held twice
            start = time.perf_counter()
            try:
                sessions[name] = make_session(paths[name], level=level)
            except FuseError as exc:
                refused[name] = str(exc)
                continue
            best[name] = min(best.get(name, math.inf), (time.perf_counter() - start) * 1000)
    return sessions, best, refused


def _latency_ratios(lat: Latency | None, base: Latency | None) -> tuple[float | None, float | None]:
    """(CPU-time, wall-time) median of `lat` over `base`'s."""
    if lat is None or base is None:
        return None, None
    return ratio(lat.cpu_median_ms, base.cpu_median_ms), ratio(lat.wall_median_ms, base.wall_median_ms)


# ---- geometric means by group ------------------------------------------------------------------

@dataclass(frozen=True)
class GroupMean:
    group: str
    tool: str
    models: int
    node_ratio: float | None
    session_ratio: float | None
    cpu_ratio_disabled: float | None
    wall_ratio_disabled: float | None
    cpu_ratio_all: float | None
    wall_ratio_all: float | None
    peak_ratio: float | None


MEAN_FIELDS = ("node_ratio", "session_ratio", "cpu_ratio_disabled", "wall_ratio_disabled", "cpu_ratio_all",
               "wall_ratio_all", "peak_ratio")  # GroupMean's figures, in its order


def group_means(models: Sequence[ModelResult], tools: Sequence[str]) -> list[GroupMean]:
    """Per group (a model counts in each of its groups) and `all`, per tool: the geometric mean of
    each ratio over the models whose output ran; a model without that figure is left out of it."""
    means = []
    for group in (*(g.name for g in GROUPS), ALL):
        members = [m for m in models if group == ALL or group in m.groups]
        for tool in (NOISE, *tools):
            rows = [r for m in members for r in m.results if r.tool == tool and r.latency_disabled is not None]
            if rows:
                means.append(GroupMean(group, tool, len(rows),
                                       **{f: _geomean([getattr(r, f) for r in rows]) for f in MEAN_FIELDS}))
    return means


def _geomean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in present) / len(present)) if present else None


# ---- rendering: rich and Markdown share the rows functions --------------------------------------

HEADERS = ("Model", "Tool", "Nodes", "Optimize", "Opt. RSS +", "Session", "CPU disabled", "Wall disabled",
           "CPU all", "Wall all", "Peak memory", "Max abs diff")
GROUP_HEADERS = ("Group", "Tool", "Models", "Nodes ×", "Session ×", "CPU disabled ×", "Wall disabled ×",
                 "CPU all ×", "Wall all ×", "Peak memory ×")
MEMBER_HEADERS = ("Group", "Who is in it", "Models in this run")
LEVELS_SENTENCE = ("CPU, one intra-op thread. `disabled`: onnxruntime's graph optimizations off (ORT_DISABLE_ALL, "
                   "the graph as written); `all`: ORT_ENABLE_ALL, onnxruntime's default. Session: creating the "
                   "session from the file, at `all`. Original rows: absolute figures; tool rows: ratios to the "
                   "original (below 1 is better).")


def table_rows(models: Sequence[ModelResult]) -> list[list[tuple[str, ...]]]:
    """One block per model: the original (absolute figures) then each tool (ratios to it)."""
    blocks = []
    for m in models:
        dis, full = m.latency_disabled, m.latency_all
        block = [(m.name, "original", str(m.nodes), "-", "-", _ms(m.session_ms),
                  _ms(dis and dis.cpu_median_ms), _ms(dis and dis.wall_median_ms),
                  _ms(full and full.cpu_median_ms), _ms(full and full.wall_median_ms),
                  human_bytes(m.peak_bytes) if m.peak_bytes is not None else "-", m.error or "-")]
        for r in m.results:
            if r.error is not None and r.latency_disabled is None:
                block.append(("", r.tool, _int(r.nodes), _seconds(r.optimize_seconds),
                              _bytes(r.optimizer_rss_growth_bytes), "failed", "", "", "", "", "", r.error))
                continue
            block.append(("", r.tool, _int(r.nodes), _seconds(r.optimize_seconds), _bytes(r.optimizer_rss_growth_bytes),
                          _times(r.session_ratio), _times(r.cpu_ratio_disabled), _times(r.wall_ratio_disabled),
                          _times(r.cpu_ratio_all), _times(r.wall_ratio_all), _peak(r),
                          _diff(r.max_abs_diff) + (f"; {r.error}" if r.error else "")))
        blocks.append(block)
    return blocks


def group_rows(means: Sequence[GroupMean]) -> list[tuple[str, ...]]:
    return [(g.group, g.tool, str(g.models), *(_times(getattr(g, f)) for f in MEAN_FIELDS)) for g in means]


def member_rows(models: Sequence[ModelResult]) -> list[tuple[str, ...]]:
    """Every group, its rule and the models of this run in it."""
    rows = [(g.name, g.rule, ", ".join(m.name for m in models if g.name in m.groups) or "none")
            for g in GROUPS]
    return rows + [(ALL, "every model", str(len(models)))]


def _peak(r: ToolResult) -> str:
    """The ratio, or the bytes where the original's peak is too small for one to mean anything."""
    if r.peak_ratio is not None or r.peak_bytes is None:
        return _times(r.peak_ratio)
    return human_bytes(r.peak_bytes)


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _bytes(value: int | None) -> str:
    return "-" if value is None else human_bytes(max(value, 0))


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _diff(value: float | None) -> str:
    return "-" if value is None else "0" if value == 0 else f"{value:.2g}"


def render_rich(run: Mapping[str, Any], models: Sequence[ModelResult], means: Sequence[GroupMean],
                console: Console) -> None:
    table = Table(title="fuse and its peers", caption=LEVELS_SENTENCE.replace("`", ""), title_justify="left",
                  caption_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i < 2 or i == len(HEADERS) - 1 else "right",
                         overflow="fold", max_width=40 if i == len(HEADERS) - 1 else None)
    for block in table_rows(models):
        for i, row in enumerate(block):
            table.add_row(*row, end_section=i == len(block) - 1)
    console.print(table)
    members = Table(title="Groups (a model can count in two)", title_justify="left")
    for header in MEMBER_HEADERS:
        members.add_column(header, overflow="fold")
    for row in member_rows(models):
        members.add_row(*row)
    console.print(members)
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
           LEVELS_SENTENCE, "",
           _md_table(HEADERS, [row for block in table_rows(models) for row in block]), "",
           "## Groups", "", "A model counts in every group whose rule it meets, so a CNN at opset 14 counts twice.", "",
           _md_table(MEMBER_HEADERS, member_rows(models), left=3), "",
           "## Geometric means by group", "", _md_table(GROUP_HEADERS, group_rows(means)), "", "## Tools", ""]
    for tool in run["tools"]:
        state = f"skipped: {tool['skipped']}" if tool["skipped"] else "ran"
        out.append(f"- `{tool['name']}` ({tool['label']}), version {tool['version'] or 'unknown'}: {state}")
    out += ["", "## How it was measured", ""] + [f"- {line}" for line in notes(run)]
    return "\n".join(out) + "\n"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 2) -> str:
    """A Markdown table, its first `left` columns aligned left and the figures after them right."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def notes(run: Mapping[str, Any]) -> list[str]:
    disabled, full = run["settings"]["timing"]["disabled"], run["settings"]["timing"]["all"]
    lines = [
        "Optimize: wall time of one run of the optimizer, file to file, in a child process, imports excluded "
        "(fuse's includes its own check of the outputs in onnxruntime). Opt. RSS +: that child's peak RSS "
        "(VmHWM, reset through /proc/self/clear_refs after the imports) above its RSS then.",
        f"Session: wall time to create the onnxruntime session from the model file at ORT_ENABLE_ALL (CPU "
        f"provider, one thread), the smallest of {full['session_repeats']} creations, made in alternating rounds "
        "over the original, its second session and the tools' outputs (files already in the page cache).",
        "CPU / Wall disabled and all: median per-run time of the calling thread's CPU / of the clock, at "
        "ORT_DISABLE_ALL and at ORT_ENABLE_ALL. At each level a model's sessions are timed in alternating "
        f"rounds after warm-up: at least {disabled['min_samples']} and at most {disabled['max_samples']} samples "
        f"at `disabled`, at least {full['min_samples']} and at most {full['max_samples']} at `all`. `noise-floor` "
        "is the original against a second session of itself, at both levels and for session creation.",
        f"Peak memory (at `disabled`): {run['peak_method']} Where the original's peak is under "
        f"{human_bytes(PEAK_RATIO_FLOOR_BYTES)} the tool rows give bytes, not a ratio: the measurement's noise "
        "is tens of pages.",
        "Max abs diff: largest absolute difference from the original's outputs on the same seeded random inputs "
        f"(symbolic dims: {_dims_text(run['settings']['dims'])}, others 1).",
        "The light models build most weights at run time from ConstantOfShape: a tool that folds them into "
        "initializers lowers the measured peak activation memory by the weights' size.",
    ]
    return lines


def to_json(run: Mapping[str, Any], models: Sequence[ModelResult], means: Sequence[GroupMean]) -> dict[str, Any]:
    def tool_json(r: ToolResult) -> dict[str, Any]:
        data = asdict(r)
        data["latency_disabled"] = _latency_json(r.latency_disabled)
        data["latency_all"] = _latency_json(r.latency_all)
        return data

    return {
        **run,
        "models": [{
            "name": m.name, "path": _shown_path(m.path), "groups": list(m.groups), "nodes": m.nodes,
            "input_shapes": {k: list(v) for k, v in m.input_shapes.items()}, "session_ms": m.session_ms,
            "latency_disabled": _latency_json(m.latency_disabled), "latency_all": _latency_json(m.latency_all),
            "peak_bytes": m.peak_bytes, "error": m.error,
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

def _dims_text(given: Mapping[str, int]) -> str:
    def text(defaults):
        return ", ".join(f"{k}={v}" for k, v in {**defaults, **given}.items())
    return f"{text(DEFAULT_DIMS)}; transformers {text(TRANSFORMER_DIMS)}"


def default_models() -> list[Path]:
    """The samples and the onnx package's light zoo; with $MODELS, the samples and that folder
    (the light zoo's 9 models would add a quarter of an hour to a corpus run)."""
    models = sorted(SAMPLES.glob("*.onnx"))
    if not os.environ.get("MODELS"):
        return models + sorted(LIGHT_MODELS.glob("*.onnx"))
    folder = Path(os.environ["MODELS"])
    if not folder.is_dir():
        raise SystemExit(f"run.py: MODELS={folder} is not a folder")
    return models + sorted(folder.glob("*.onnx"))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path,
                        help="models to run (default: samples and light zoo, or samples and $MODELS)")
    parser.add_argument("--quick", action="store_true", help="few timing runs (for tests; figures not comparable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for latest.md and latest.json")
    parser.add_argument("--tools", default=",".join(TOOL_NAMES), help=f"comma-separated, from {', '.join(TOOL_NAMES)}")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help=f"bind a symbolic dim (default {_dims_text({})})")
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

    dims = {}  # the user's; each model adds its group's defaults (bench_model)
    for item in args.dim:
        key, _, value = item.partition("=")
        dims[key] = int(value)
    timing = QUICK_TIMING if args.quick else DEFAULT_TIMING
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
                     "graph_optimization": list(LEVELS),
                     "timing": {level: asdict(timing[level]) for level in LEVELS}},
        "peak_method": measure_method(timing["disabled"]),
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
