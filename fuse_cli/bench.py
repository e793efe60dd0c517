"""`fuse bench`: a model and its fused form in onnxruntime, side by side: latency, session-creation
time and measured peak activation memory, per provider and graph-optimization level.

How each figure is taken, and why:

- Sessions get one intra-op and one inter-op thread. The machines this runs on are small and
  shared; with one thread onnxruntime runs every kernel on the calling thread, so that thread's
  CPU time (`time.thread_time`) is the work the model did, which other processes' load hardly
  moves. Wall time (`time.perf_counter`) is reported beside it.
- Both graph-optimization levels: `disabled` runs the graph as written (what fusing it changed),
  `all` is onnxruntime's default (ORT_ENABLE_ALL: what a user of onnxruntime gets anyway).
- Latency: after a warm-up, the sessions compared are timed in alternating rounds (one sample of
  each per round, the order rotating), so a burst of load hits all of them alike. A sample is
  `runs_per_sample` back-to-back runs, enough to last `sample_seconds`, so a model that runs in
  microseconds is not measured as timer and Python overhead. Rounds go on until there are
  `min_samples` and every session has been timed for `min_seconds`, and stop at `max_samples`.
  Median and p90 of the per-run times.
- Session creation: the smallest of `session_repeats` creations from the model file (a fused model
  made in memory is written to a temporary file first, so both pay for reading a file).
- Peak activation memory: `fuse_cli.analysis.measure.measure_peak`, in a child process, which
  measures onnxruntime's CPU provider with graph optimizations disabled; so it fills the CPU /
  `disabled` rows and the other rows carry none.
- Providers: CPU always; CUDA only when a session really gets CUDAExecutionProvider.
  `onnxruntime.get_available_providers()` lists it whenever the package was built with it, even
  when the CUDA libraries are missing, and asking for it then logs errors and falls back to CPU;
  so a child process asks once, quietly, and the reason it did not load is reported.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from fuse_cli import api
from fuse_cli.analysis.measure import measure_peak
from fuse_cli.config import UNBOUND_DIM, FuseConfig
from fuse_cli.core import isolation, sessions
from fuse_cli.errors import FuseError, ModelLoadError, UsageError
from fuse_cli.graph.save import save_model
from fuse_cli.report.bench_records import (
    BENCH_SCHEMA_VERSION, PEAK_RATIO_FLOOR_BYTES, QUICK, BenchResult, BenchRow, Latency, Timing)

# the bench records are re-exported: the bench API its callers import; __all__ says so to linters
__all__ = ["BENCH_SCHEMA_VERSION", "GRAPH_OPTIMIZATION", "PEAK_RATIO_FLOOR_BYTES", "PROVIDERS", "QUICK", "BenchResult",
           "BenchRow", "Latency", "Timing", "bench", "feeds_for", "make_session", "original_inputs", "peak_ratio",
           "random_inputs_for", "ratio", "time_models", "time_sessions", "timed_session", "usable_providers"]

PROVIDERS = {"CPU": "CPUExecutionProvider", "CUDA": "CUDAExecutionProvider"}
GRAPH_OPTIMIZATION = {"disabled": "ORT_DISABLE_ALL", "all": "ORT_ENABLE_ALL"}
_PROBE_TIMEOUT_S = 120


def bench(model_path: str | os.PathLike, optimized_path: str | os.PathLike | None = None, *,
          config: FuseConfig | None = None, dims: Mapping[str, int] | None = None,
          providers: Sequence[str] | None = None, levels: Sequence[str] = tuple(GRAPH_OPTIMIZATION),
          timing: Timing = Timing(), measure_memory: bool = True, seed: int = 0) -> BenchResult:
    """Benchmark `model_path` against `optimized_path`, or, without one, against what fuse makes
    of it in memory with `config` (default: the default configuration with `dims`). Symbolic
    input dims come from `dims` (else the config's dims), unbound ones are 1. `providers` are
    names from PROVIDERS (default: every one that really loads); `levels` from GRAPH_OPTIMIZATION."""
    import onnxruntime as ort

    unknown = [p for p in providers or () if p not in PROVIDERS] + [lv for lv in levels if lv not in GRAPH_OPTIMIZATION]
    if unknown:
        raise UsageError(f"unknown provider or level {unknown[0]!r}: choose from "
                         f"{', '.join([*PROVIDERS, *GRAPH_OPTIMIZATION])}")
    source = Path(model_path)
    for path in (source, optimized_path):
        if path is not None and not Path(path).is_file():
            raise ModelLoadError(f"{path}: no such file")
    config = config or FuseConfig(dims=dict(dims or {}))
    dims = dict(dims if dims is not None else config.dims)
    usable, skipped = usable_providers()
    chosen = [p for p in (providers or usable) if p in usable]
    skipped = tuple(s for s in skipped if s[0] in (providers or PROVIDERS))

    with tempfile.TemporaryDirectory(prefix="fuse-bench-") as tmp:
        if optimized_path is None:
            fused_path = Path(tmp) / f"{source.stem}.fused.onnx"
            save_model(api.optimize(source, config, dry_run=True).model_by_reference, fused_path)
            fused_by = f"fuse --target {config.target} (configuration: {config.source}), in memory"
        else:
            fused_path = Path(optimized_path)
            fused_by = str(optimized_path)
        paths = {"original": source, "fused": fused_path}
        nodes = {name: len(onnx.load(str(p), load_external_data=False).graph.node) for name, p in paths.items()}
        feeds = _in_worker(original_inputs, "making the original's inputs", str(source), dims, seed)
        shapes = {name: tuple(int(d) for d in value.shape) for name, value in feeds.items()}
        if measure_memory:
            peaks, peak_method, peak_not_measured = _measure_peaks(paths, dims, shapes, seed, timing.peak_repeats)
        else:
            peaks, peak_method, peak_not_measured = {}, None, "not asked for"

        rows: list[BenchRow] = []
        for provider in chosen:
            for level in levels:
                latencies, session_ms = _in_worker(
                    time_models, f"timing the models on {provider} at graph optimization {level}",
                    {name: str(path) for name, path in paths.items()}, provider, level, feeds, dims, seed, timing)
                peak_here = provider == "CPU" and level == "disabled"
                rows += _rows(latencies, session_ms, peaks if peak_here else {}, provider, level)

    return BenchResult(
        original=str(source), optimized=None if optimized_path is None else str(optimized_path), fused_by=fused_by,
        nodes_original=nodes["original"], nodes_fused=nodes["fused"], input_shapes=tuple(shapes.items()),
        rows=tuple(rows), skipped_providers=skipped, peak_method=peak_method, peak_not_measured=peak_not_measured,
        timing=timing, onnxruntime_version=ort.__version__, seed=seed,
    )


def _in_worker(function, doing: str, *args):
    """function(*args) in the worker process (core/isolation.py): a model that crashes onnxruntime
    ends the benchmark with one line that says so, not fuse."""
    try:
        return isolation.call(function, *args)
    except isolation.RuntimeCrash as crash:
        raise FuseError(f"{crash} {doing}") from None


def original_inputs(path: str, dims: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    return random_inputs_for(make_session(path), dims=dims, seed=seed)


def time_models(paths: Mapping[str, str], provider: str, level: str, feeds: Mapping[str, np.ndarray],
                dims: Mapping[str, int], seed: int, timing: Timing) -> tuple[dict[str, Latency], dict[str, float]]:
    """Each model's session (its best creation time) and their latencies, timed in alternating
    rounds, on the original's inputs."""
    built, session_ms = {}, {}
    for name, path in paths.items():
        built[name], session_ms[name] = timed_session(path, provider, level, timing.session_repeats)
    return time_sessions(built, {n: feeds_for(s, feeds, dims=dims, seed=seed) for n, s in built.items()},
                         timing), session_ms


def _measure_peaks(paths: Mapping[str, Path], dims: Mapping[str, int], shapes: Mapping[str, tuple[int, ...]],
                   seed: int, repeats: int) -> tuple[dict[str, int | None], str | None, str | None]:
    """measure_peak of each model at the same input shapes: (bytes by model, method, why not)."""
    peaks: dict[str, int | None] = {}
    method = reason = None
    for name, path in paths.items():
        try:
            measured = measure_peak(path, dims=dims, input_shapes=shapes, seed=seed, repeats=repeats)
        except ValueError as exc:  # an input of the fused model that the original's shapes do not cover
            return {}, None, str(exc)
        peaks[name], method, reason = measured.peak_bytes, measured.method, reason or measured.reason
    return peaks, method, reason


def _rows(latencies: Mapping[str, Latency], session_ms: Mapping[str, float], peaks: Mapping[str, int | None],
          provider: str, level: str) -> list[BenchRow]:
    base = latencies["original"]
    rows = []
    for name, lat in latencies.items():
        fused = name != "original"
        rows.append(BenchRow(
            model=name, provider=provider, graph_optimization=level, session_ms=session_ms[name],
            samples=lat.samples, runs_per_sample=lat.runs_per_sample,
            wall_median_ms=lat.wall_median_ms, wall_p90_ms=lat.wall_p90_ms,
            cpu_median_ms=lat.cpu_median_ms, cpu_p90_ms=lat.cpu_p90_ms,
            peak_bytes=peaks.get(name),
            wall_ratio=ratio(lat.wall_median_ms, base.wall_median_ms) if fused else None,
            cpu_ratio=ratio(lat.cpu_median_ms, base.cpu_median_ms) if fused else None,
            peak_ratio=peak_ratio(peaks.get(name), peaks.get("original")) if fused else None,
            session_ratio=ratio(session_ms[name], session_ms["original"]) if fused else None,
        ))
    return rows


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base <= 0:
        return None
    return value / base


def peak_ratio(value: int | None, base: int | None) -> float | None:
    """A ratio of measured peaks, None below PEAK_RATIO_FLOOR_BYTES."""
    if base is None or base < PEAK_RATIO_FLOOR_BYTES:
        return None
    return ratio(value, base)


# ---- sessions, inputs and timing (benchmarks/run.py uses these too) -----------------------------

def make_session(model: str | os.PathLike | bytes, provider: str = "CPU", level: str = "disabled"):
    """A one-thread onnxruntime session on `provider` ("CPU" or "CUDA"), refusing a silent fall
    back from CUDA to CPU."""
    wanted = [PROVIDERS[provider]] + ([PROVIDERS["CPU"]] if provider != "CPU" else [])
    session = sessions.make_session(model, level=level, providers=wanted, threads=1)
    if session.get_providers()[0] != PROVIDERS[provider]:
        raise FuseError(f"onnxruntime did not give this session the {provider} provider")
    return session


def timed_session(model: str | os.PathLike, provider: str, level: str, repeats: int) -> tuple[Any, float]:
    """The session and the smallest creation time of `repeats`, in milliseconds."""
    best, session = math.inf, None
    for _ in range(repeats):
        del session
        start = time.perf_counter()
        session = make_session(model, provider, level)
        best = min(best, time.perf_counter() - start)
    return session, best * 1000


def random_inputs_for(session, *, dims: Mapping[str, int], seed: int = 0,
                      int_ranges: Mapping[str, tuple[int, int] | None] | None = None) -> dict[str, np.ndarray]:
    """core.feeds.random_inputs with symbolic dims from `dims`, 1 where unbound; integer inputs
    in `int_ranges` (input_domain.integer_ranges: the rows an embedding has)."""
    from fuse_cli.core.feeds import random_inputs

    return random_inputs(session, dims=dims, seed=seed, int_ranges=int_ranges, default_dim=UNBOUND_DIM)


def feeds_for(session, feeds: Mapping[str, np.ndarray], *, dims: Mapping[str, int], seed: int = 0,
              int_ranges: Mapping[str, tuple[int, int] | None] | None = None) -> dict[str, np.ndarray]:
    """The original's inputs, by name, for another model of it; an input the original does not
    have (onnxruntime's saved models can keep some) gets random data of its own."""
    wanted = [i.name for i in session.get_inputs()]
    missing = [name for name in wanted if name not in feeds]
    extra = random_inputs_for(session, dims=dims, seed=seed, int_ranges=int_ranges) if missing else {}
    return {name: feeds[name] if name in feeds else extra[name] for name in wanted}


def time_sessions(sessions: Mapping[str, Any], feeds: Mapping[str, Mapping[str, np.ndarray]],
                  timing: Timing) -> dict[str, Latency]:
    """Time the sessions in alternating rounds (see the module docstring)."""
    names = list(sessions)
    runners: dict[str, Callable[[], object]] = {
        name: functools.partial(sessions[name].run, None, dict(feeds[name])) for name in names}
    per_run = {}
    for name in names:
        runs, start = 0, time.perf_counter()
        while runs < timing.warmup_runs or time.perf_counter() - start < timing.warmup_seconds:
            runners[name]()
            runs += 1
        per_run[name] = (time.perf_counter() - start) / runs
    number = {name: max(1, math.ceil(timing.sample_seconds / max(per_run[name], 1e-9))) for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    spent = dict.fromkeys(names, 0.0)
    rounds = 0
    while True:
        for name in names[rounds % len(names):] + names[:rounds % len(names)]:
            run, n = runners[name], number[name]
            wall_start, cpu_start = time.perf_counter(), time.thread_time()
            for _ in range(n):
                run()
            cpu_s, wall_s = time.thread_time() - cpu_start, time.perf_counter() - wall_start
            wall[name].append(wall_s * 1000 / n)
            cpu[name].append(cpu_s * 1000 / n)
            spent[name] += wall_s
        rounds += 1
        if rounds >= timing.max_samples:
            break
        if rounds >= timing.min_samples and min(spent.values()) >= timing.min_seconds:
            break
    return {name: Latency(rounds, number[name], statistics.median(wall[name]), _p90(wall[name]),
                          statistics.median(cpu[name]), _p90(cpu[name])) for name in names}


def _p90(values: Sequence[float]) -> float:
    return float(np.percentile(values, 90))


# ---- which providers really load ----------------------------------------------------------------

_PROBE = """
import json, onnxruntime as ort
from onnx import TensorProto, helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
options = ort.SessionOptions()
options.log_severity_level = 3
session = ort.InferenceSession(model.SerializeToString(), options, providers=%r)
print(json.dumps(session.get_providers()))
"""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@functools.cache
def usable_providers() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(providers a session really gets, (provider, why not) for the others), asked once."""
    import onnxruntime as ort

    usable, skipped = ["CPU"], []
    listed = ort.get_available_providers()
    for name, ort_name in PROVIDERS.items():
        if name == "CPU":
            continue
        if ort_name not in listed:
            skipped.append((name, f"this onnxruntime build ({ort.__version__}) has no {ort_name}"))
            continue
        reason = _probe(ort_name)
        if reason is None:
            usable.append(name)
        else:
            skipped.append((name, reason))
    return tuple(usable), tuple(skipped)


def _probe(ort_name: str) -> str | None:
    """None when a session in a fresh process gets `ort_name`; else why not."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE % [ort_name, PROVIDERS["CPU"]]], capture_output=True,
                              text=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"asking for {ort_name} ran past {_PROBE_TIMEOUT_S} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines and ort_name in json.loads(lines[-1]):
        return None
    errors = [_ANSI.sub("", line).strip() for line in done.stderr.splitlines() if line.strip()]
    detail = next((line for line in errors if "Failed to load library" in line), errors[0] if errors else "")
    detail = detail.split("with error: ", 1)[-1][:200]
    return f"onnxruntime lists {ort_name} but a session falls back to CPU" + (f" ({detail})" if detail else "")
