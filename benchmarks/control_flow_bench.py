"""The control-flow table (issue 29): fuse and its peers on every model of the control-flow corpus.

    make control-flow-bench      # after `make bench-corpus`; writes benchmarks/results/control_flow.md and .json
    .venv/bin/python benchmarks/control_flow_bench.py [--models DIR] [--out DIR] [--quick] [--timeout S]

For each model: nodes counted with every If, Loop and Scan body (recursively) for the original,
`fuse optimize --target onnx`, `fuse optimize --target ort-cpu`, onnxslim, onnx-simplifier and
onnxruntime's offline optimizer at the extended level; fuse's exit code and verification status
(its `--json -` report); CPU time of each output at onnxruntime's `disabled` and `all` levels, one
thread, over the original's; and fuse's memory estimate against the allocator's measured peak
(`fuse report --measure --json -`). Every tool runs in a child process with a timeout: a tool that
fails, hangs, or writes a model that does not load or run is a cell saying so, never a crash here.

Each model runs at the binding the corpus manifest gives it (`bench`: dims, whole input shapes,
integer-input ranges; benchmarks/corpus/control_flow.py), passed to fuse as --dim, --input-shape
and --int-range and used for the feeds of the timing runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as peers  # noqa: E402 - the sibling script: its child-process optimizers and timing settings

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from fuse_cli.bench import QUICK, feeds_for, make_session, random_inputs_for, time_sessions  # noqa: E402
from fuse_cli.input_domain import integer_ranges, with_computed_dims  # noqa: E402
from fuse_cli.verify import compare_outputs, run as run_session  # noqa: E402

REPO = peers.REPO
DEFAULT_MODELS = REPO / "benchmarks" / "corpus" / "control-flow-models"
DEFAULT_OUT = REPO / "benchmarks" / "results"
FUSE_TARGETS = ("onnx", "ort-cpu")
PEERS = ("onnxslim", "onnxsim", "ort-extended")
TOOLS = tuple(f"fuse-{t}" for t in FUSE_TARGETS) + PEERS
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")
LEVELS = peers.LEVELS
DEFAULT_TIMEOUT_S = 600


# ---- pure helpers -------------------------------------------------------------------------------

def cpu_ratios(sessions: Mapping[str, Any], feeds: Mapping[str, np.ndarray], dims: Mapping[str, int],
               ranges: Mapping[str, tuple[int, int]], timing) -> tuple[float, dict[str, float | None]]:
    """The original's median CPU time (ms) and every other session's over it, timed in interleaved
    rounds (fuse_cli.bench.time_sessions) on the same feeds."""
    latencies = time_sessions(sessions, {n: feeds_for(s, feeds, dims=dims, int_ranges=ranges)
                                         for n, s in sessions.items()}, timing)
    base = latencies["original"].cpu_median_ms
    return base, {name: latency.cpu_median_ms / base if base else None
                  for name, latency in latencies.items() if name != "original"}


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds: an If's branches, a Loop's or Scan's body (any GRAPH or GRAPHS attribute)."""
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        yield from attribute.graphs


def op_counts(graph: onnx.GraphProto) -> Counter:
    """Op types of every node of `graph` and, recursively, of every subgraph its nodes hold."""
    counts = Counter(node.op_type for node in graph.node)
    for node in graph.node:
        for body in subgraphs(node):
            counts += op_counts(body)
    return counts


def count_nodes(graph: onnx.GraphProto) -> int:
    return sum(op_counts(graph).values())


def control_flow_text(graph: onnx.GraphProto) -> str:
    counts = op_counts(graph)
    return ", ".join(f"{op} {counts[op]}" for op in CONTROL_FLOW_OPS if counts[op]) or "none"


def last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def short(text: str | None, limit: int = 90) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A Markdown table, the columns in `right` (figures) aligned right, the others left."""
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in row) + " |"
              for row in rows]
    return "\n".join(lines)


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f} MiB" if value >= 2**20 else f"{value / 1024:.1f} KiB"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# ---- results ------------------------------------------------------------------------------------

@dataclass
class ToolRow:
    tool: str
    nodes: int | None = None
    error: str | None = None  # the tool failed (fuse: exited non-zero): the cell says how
    load_error: str | None = None  # the file it wrote does not load or run at the binding
    seconds: float | None = None
    exit_code: int | None = None  # fuse only
    verification: str | None = None  # fuse only: match / mismatch / inconclusive / unverifiable / off
    max_abs_diff: float | None = None
    cpu_ratio: dict[str, float | None] = field(default_factory=dict)  # level -> CPU median over the original's


@dataclass
class Memory:
    exit_code: int | None = None
    error: str | None = None
    estimate_before: int | None = None
    measured_before: int | None = None
    estimate_after: int | None = None
    measured_after: int | None = None


@dataclass
class ModelRow:
    name: str
    control_flow: str
    nodes: int
    nodes_top: int
    binding: dict[str, Any]
    cpu_ms: dict[str, float | None] = field(default_factory=dict)  # the original's CPU median per level
    error: str | None = None  # the original itself does not run at its binding
    tools: list[ToolRow] = field(default_factory=list)
    memory: Memory = field(default_factory=Memory)

    def tool(self, name: str) -> ToolRow | None:
        return next((t for t in self.tools if t.tool == name), None)


# ---- rendering ----------------------------------------------------------------------------------

def node_cell(row: ToolRow | None) -> str:
    if row is None:
        return "not run"
    if row.nodes is None:
        return f"failed: {short(row.error or row.load_error, 60)}"
    if row.load_error:
        return f"{row.nodes}, does not load"
    return f"{row.nodes}, exit {row.exit_code}" if row.exit_code not in (0, None) else str(row.nodes)


def _usable_nodes(row: ToolRow | None) -> int | None:
    """A count that meets the goal's terms: the file loads and runs, and fuse exited 0."""
    return None if row is None or row.error or row.load_error else row.nodes


def node_goal(model: ModelRow, fuse_tool: str, rivals: Sequence[str]) -> str:
    """Issue 29's node goal for one target: fuse's loadable output at or below the best rival's
    loadable output ("no rival" when none of them wrote one)."""
    ours = _usable_nodes(model.tool(fuse_tool))
    theirs = [n for n in (_usable_nodes(model.tool(r)) for r in rivals) if n is not None]
    if not theirs:
        return "no rival"
    return "no" if ours is None or ours > min(theirs) else "yes"


def nodes_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    return [[m.name, m.control_flow, f"{m.nodes} ({m.nodes_top} top)"] + [node_cell(m.tool(t)) for t in TOOLS]
            + [f"{node_goal(m, 'fuse-onnx', ('onnxslim', 'onnxsim'))} / "
               f"{node_goal(m, 'fuse-ort-cpu', ('ort-extended',))}"]
            for m in models]


def fuse_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    rows = []
    for m in models:
        for target in FUSE_TARGETS:
            r = m.tool(f"fuse-{target}")
            if r is None:
                continue
            rows.append([m.name, target, "-" if r.exit_code is None else str(r.exit_code), r.verification or "-",
                         "-" if r.seconds is None else f"{r.seconds:.1f}",
                         "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.2g}",
                         short("; ".join(e for e in (r.error, r.load_error and f"output: {r.load_error}") if e), 240)])
    return rows


def time_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    rows = []
    for m in models:
        base = " / ".join("-" if m.cpu_ms.get(level) is None else f"{m.cpu_ms[level]:.3f}" for level in LEVELS)
        rows.append([m.name, "original (ms)", base, ""])
        for r in m.tools:
            if r.cpu_ratio:
                rows.append([m.name, r.tool, " / ".join(times(r.cpu_ratio.get(level)) for level in LEVELS), ""])
            else:
                rows.append([m.name, r.tool, "-", "does not load or run" if r.nodes is not None else "no output"])
    return rows


def memory_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    rows = []
    for m in models:
        mem = m.memory
        if mem.error:
            rows.append([m.name, "-", "-", "-", "-", "-", short(f"exit {mem.exit_code}: {mem.error}", 240)])
            continue
        ratio = (None if not mem.estimate_before or not mem.measured_before
                 else mem.estimate_before / mem.measured_before)
        rows.append([m.name, mib(mem.estimate_before), mib(mem.measured_before), times(ratio),
                     mib(mem.estimate_after), mib(mem.measured_after), ""])
    return rows


def markdown(run: Mapping[str, Any], models: Sequence[ModelRow]) -> str:
    out = ["# Control-flow models: fuse and its peers", "",
           f"{run['created']}, `benchmarks/control_flow_bench.py`, {run['seconds']} s; {run['machine']['platform']}, "
           f"onnx {run['machine']['onnx']}, onnxruntime {run['machine']['onnxruntime']}; "
           + ", ".join(f"{k} {v}" for k, v in run["versions"].items()) + ".", "",
           "## Nodes, every subgraph counted", "",
           md_table(("Model", "Control flow", "Original") + TOOLS + ("At or below the best peer (onnx / ort-cpu)",),
                    nodes_rows(models), right=range(2, 8)), "",
           "## fuse: exit code and verification", "",
           md_table(("Model", "Target", "Exit", "Verification", "Seconds", "Max abs diff", "Error"),
                    fuse_rows(models), right=(2, 4, 5)), "",
           "## CPU time, one thread, over the original's (`disabled` / `all`)", "",
           md_table(("Model", "Tool", "disabled / all", "Why not"), time_rows(models), right=(2,)), "",
           "## Memory: fuse's estimate against the allocator's measured peak (`--target onnx`)", "",
           md_table(("Model", "Estimate", "Measured", "Estimate / measured", "Estimate after", "Measured after",
                     "Error"), memory_rows(models), right=range(1, 6)), "",
           "## How it was measured", ""]
    out += [f"- {line}" for line in run["notes"]]
    bindings = [f"- {m.name}: {json.dumps(m.binding)}" + (f" (the original does not run: {m.error})" if m.error else "")
                for m in models]
    out += ["", "Bindings (dims, input shapes, integer ranges; from the corpus manifest):", ""] + bindings
    return "\n".join(out) + "\n"


NOTES = (
    "Nodes: every node of the graph and, recursively, of every If branch and Loop/Scan body. "
    "\"does not load\": the tool wrote a file that onnxruntime refuses or cannot run at the binding. "
    "Last column: fuse --target onnx against the better of onnxslim and onnx-simplifier, --target ort-cpu "
    "against onnxruntime's extended level, counting only outputs that load and run "
    "(a fuse output that does not is \"no\").",
    "fuse: `fuse optimize MODEL -o OUT --target T --json -` with the binding's --dim/--input-shape/--int-range, "
    "verification on (the default); exit code and `verification.status` from its JSON report "
    "(\"-\": no report, see Error). A file left at the output path after a non-zero exit is loaded and counted.",
    "Peers: benchmarks/run.py's child processes (onnxslim.slim, onnxsim.simplify, onnxruntime's "
    "optimized_model_filepath at ORT_ENABLE_EXTENDED), defaults, one process per tool.",
    "CPU time: fuse_cli.bench.time_sessions, one intra-op thread, alternating rounds; `disabled` = "
    "ORT_DISABLE_ALL (the graph as written), `all` = ORT_ENABLE_ALL. Max abs diff: against the original on the "
    "same seeded inputs.",
    "Memory: `fuse report MODEL --target onnx --measure --json -`: memory.peak_bytes (estimate) and "
    "measured.peak_bytes (the allocator's high-water mark), before (the original) and after (fuse's output).",
)


# ---- running the tools --------------------------------------------------------------------------

def binding_args(binding: Mapping[str, Any]) -> list[str]:
    args = []
    for name, value in binding.get("dims", {}).items():
        args += ["--dim", f"{name}={value}"]
    for name, shape in binding.get("input_shapes", {}).items():
        args += ["--input-shape", f"{name}:{'x'.join(str(d) for d in shape)}"]
    for name, (low, high) in binding.get("int_ranges", {}).items():
        args += ["--int-range", f"{name}={low}:{high}"]
    return args


def fuse_child(args: Sequence[str], timeout: float) -> tuple[int | None, dict | None, str]:
    """(exit code, the JSON report or None, why there is none) of `fuse ARGS --json -` in a child."""
    command = [sys.executable, "-m", "fuse_cli", *args, "--json", "-"]
    try:
        with tempfile.TemporaryDirectory(prefix="fuse-cf-cwd-") as scratch:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, cwd=scratch,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        return None, None, f"ran past {timeout:.0f} s"
    try:
        return done.returncode, json.loads(done.stdout), ""
    except json.JSONDecodeError:
        return done.returncode, None, last_line(done.stderr) or f"exit {done.returncode}, no report"


def run_fuse(model: Path, target: str, destination: Path, binding: Mapping[str, Any], timeout: float) -> ToolRow:
    row = ToolRow(f"fuse-{target}")
    start = time.perf_counter()
    code, report, why = fuse_child(["optimize", str(model), "-o", str(destination), "--target", target,
                                    *binding_args(binding)], timeout)
    row.seconds, row.exit_code = time.perf_counter() - start, code
    if report is not None:
        verification = report.get("verification")
        row.verification = "off" if verification is None else verification.get("status")
        failures = report.get("failures") or []
        why = why or (last_line(str(failures[0])) if failures else "")
    if not destination.is_file():
        row.error = why or f"exit {code}, wrote no model"
    elif code not in (0, None):
        row.error = f"exit {code}, left a file: {why}" if why else f"exit {code}, left a file"
    return row


def run_peer(tool: str, model: Path, destination: Path) -> ToolRow:
    done = peers.optimize_in_child(tool, model, destination)
    return ToolRow(tool, error=done.get("error"), seconds=done.get("seconds"))


def feed_settings(model: onnx.ModelProto, binding: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, Any]]:
    """(dims, integer ranges) for the feeds, as fuse's verification takes them: the binding's dims
    plus the input dims written as arithmetic of them (`past_sequence_length + sequence_length`);
    the ranges the graph implies (an embedding's rows), the binding's where it gives one."""
    dims = with_computed_dims(model, binding.get("dims", {}))
    ranges = {**integer_ranges(model), **{name: tuple(span) for name, span in binding.get("int_ranges", {}).items()}}
    return dims, ranges


def feeds_at(session, dims: Mapping[str, int], ranges: Mapping[str, Any], binding: Mapping[str, Any],
             seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs at the binding: dims bound by name, whole shapes where the dims have no names."""
    feeds = random_inputs_for(session, dims=dims, seed=seed, int_ranges=ranges)
    rng = np.random.default_rng(seed)
    for name, shape in binding.get("input_shapes", {}).items():
        if name in feeds and np.issubdtype(feeds[name].dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(feeds[name].dtype)
    return feeds


def measure_memory(model: Path, binding: Mapping[str, Any], timeout: float) -> Memory:
    code, report, why = fuse_child(["report", str(model), "--target", "onnx", "--measure",
                                    *binding_args(binding)], timeout)
    if report is None:
        return Memory(exit_code=code, error=why)
    memory, measured = report.get("memory") or {}, report.get("measured") or {}
    estimate, peak = memory.get("peak_bytes") or {}, measured.get("peak_bytes") or {}
    result = Memory(exit_code=code, estimate_before=estimate.get("before"), measured_before=peak.get("before"),
                    estimate_after=estimate.get("after"), measured_after=peak.get("after"))
    if peak.get("before") is None:
        result.error = measured.get("reason") or f"exit {code}, nothing measured"
    return result


def bench_model(path: Path, binding: Mapping[str, Any], timing: Mapping[str, Any], timeout: float,
                progress) -> ModelRow:
    original = onnx.load(str(path), load_external_data=False)
    model = ModelRow(path.stem, control_flow_text(original.graph), count_nodes(original.graph),
                     len(original.graph.node), dict(binding))
    del original
    with tempfile.TemporaryDirectory(prefix="fuse-cf-bench-") as tmp:
        outputs: dict[str, Path] = {}
        for tool in TOOLS:
            progress(f"  {model.name}: {tool}")
            destination = Path(tmp) / f"{tool}.onnx"
            row = (run_fuse(path, tool.removeprefix("fuse-"), destination, binding, timeout)
                   if tool.startswith("fuse-") else run_peer(tool, path, destination))
            if destination.is_file():
                try:
                    row.nodes = count_nodes(onnx.load(str(destination), load_external_data=False).graph)
                    outputs[tool] = destination
                except Exception as exc:  # noqa: BLE001 - an unreadable file is a cell
                    row.load_error = f"onnx cannot read it: {type(exc).__name__}: {last_line(str(exc))}"
            model.tools.append(row)
        progress(f"  {model.name}: onnxruntime, both levels")
        time_outputs(path, model, outputs, timing)
        for row in model.tools:  # the scratch folder's name says nothing and changes every run
            row.error = row.error and row.error.replace(f"{tmp}{os.sep}", "")
            row.load_error = row.load_error and row.load_error.replace(f"{tmp}{os.sep}", "")
    progress(f"  {model.name}: fuse report --measure")
    model.memory = measure_memory(path, binding, timeout)
    return model


def time_outputs(path: Path, model: ModelRow, outputs: Mapping[str, Path], timing: Mapping[str, Any]) -> None:
    """Run each output at the binding against the original, then time the ones that ran at both levels."""
    binding = model.binding
    try:
        dims, ranges = feed_settings(onnx.load(str(path), load_external_data=False), binding)
        reference = make_session(path)
        feeds = feeds_at(reference, dims, ranges, binding)
        expected = run_session(reference, feeds)
    except Exception as exc:  # noqa: BLE001 - the original not running is the row's note
        model.error = last_line(str(exc)) or type(exc).__name__
        return
    ready: dict[str, Path] = {"original": path}
    for tool, output in outputs.items():
        row = model.tool(tool)
        try:
            session = make_session(output)
            got = run_session(session, feeds_for(session, feeds, dims=dims, int_ranges=ranges))
            row.max_abs_diff = max((o.max_abs_diff for o in compare_outputs(expected, got).outputs), default=0.0)
            ready[tool] = output
        except Exception as exc:  # noqa: BLE001 - a model that does not load or run is a cell
            row.load_error = last_line(str(exc)) or type(exc).__name__
    for level in LEVELS:
        sessions, refused = {}, {}
        for name, file in ready.items():
            try:
                sessions[name] = make_session(file, level=level)
            except Exception as exc:  # noqa: BLE001
                refused[name] = last_line(str(exc))
        if "original" not in sessions:
            model.cpu_ms[level] = None
            continue
        model.cpu_ms[level], ratios = cpu_ratios(sessions, feeds, dims, ranges, timing[level])
        for name, ratio in ratios.items():
            model.tool(name).cpu_ratio[level] = ratio
        for name, why in refused.items():
            if name != "original":
                row = model.tool(name)
                row.load_error = f"at {level}: {why}"
        del sessions


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / "manifest.json"
    return json.loads(path.read_text())["files"] if path.exists() else {}


def versions() -> dict[str, str]:
    import importlib.metadata

    found = {}
    for name in ("fuse-cli", "onnxslim", "onnxsim", "onnxruntime-gpu", "onnxruntime"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS, help="folder of .onnx files (and manifest.json)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for control_flow.md and .json")
    parser.add_argument("--only", default="", help="comma-separated model stems")
    parser.add_argument("--quick", action="store_true", help="few timing runs (figures not comparable)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per tool and model")
    args = parser.parse_args(argv)
    models = sorted(args.models.glob("*.onnx"))
    if args.only:
        models = [m for m in models if m.stem in args.only.split(",")]
    if not models:
        print(f"control-flow bench: no models in {args.models}: run `make bench-corpus` first (skipped)")
        return 0
    import onnxruntime as ort

    manifest = read_manifest(args.models)
    timing = dict.fromkeys(LEVELS, QUICK) if args.quick else peers.DEFAULT_TIMING
    started = time.perf_counter()
    rows = []
    for path in models:
        print(f"{path.name} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(path, manifest.get(path.name, {}).get("bench", {}), timing, args.timeout,
                                lambda line: print(line, file=sys.stderr, flush=True)))
    run = {"tool": "benchmarks/control_flow_bench.py",
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "seconds": round(time.perf_counter() - started, 1),
           "machine": {"platform": platform.platform(), "python": platform.python_version(),
                       "cpu_count": os.cpu_count(), "onnx": onnx.__version__, "onnxruntime": ort.__version__},
           "versions": versions(), "quick": args.quick, "timeout_s": args.timeout,
           "timing": {level: asdict(timing[level]) for level in LEVELS}, "notes": list(NOTES)}
    text = markdown(run, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "control_flow.md").write_text(text, encoding="utf-8")
    (args.out / "control_flow.json").write_text(
        json.dumps({**run, "models": [asdict(m) for m in rows]}, indent=2) + "\n",
        encoding="utf-8")
    print(text)
    print(f"Wrote {args.out / 'control_flow.md'} and .json in {run['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
