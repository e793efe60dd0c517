"""How close fuse's peak-memory estimate is to onnxruntime's measured peak, on every model at hand.

    .venv/bin/python benchmarks/memory_truth.py [--only NAME,...] [--targets onnx,ort-cpu]
                                                [--settings small,large] [--out benchmarks/results]

Models: sample_models/*.onnx, the nine light zoo models inside the onnx package, the "branchy"
models built in code (branchy_models.py: four randomly wired networks, whose Sum nodes over 3 to 7
inputs no export has, and a transformer block with parallel Q/K/V), the recurrent ones built in
code (recurrent_models.py: a BiGRU tagger, an LSTM stack, a GRU), and every corpus folder that
exists when it runs (or those in $FUSE_CORPUS_DIRS, colon-separated): benchmarks/corpus/models
(base exports and their fp16 copies), heldout-models, decoder-models and decoder-models-fp16 (`make
bench-corpus` builds those), control-flow-models (`make control-flow-corpus`), wheel-models, and build/quantized-models
(`make quantized-bench`). A folder's manifest.json, where present, gives each file's symbolic dims,
its `small` and `large` settings (or one setting: a `bench` entry's or a `dims` entry's dims, and
whole input shapes for dims with no name) and the valid ranges of its integer inputs.

Per model, target (`--target onnx`, `--target ort-cpu`) and setting: fuse's estimate before and
after fusion (`fuse_cli.api.optimize`, dry run, no verification) and the peak measured in
onnxruntime (`fuse_cli.analysis.measure.measure_peak`, a child process per run, arena and memory
pattern off). The measurement is called directly rather than through `FuseConfig(measure=True)`
because api.optimize's measurement does not forward the integer ranges (input ids must stay below
the vocabulary size). The original is measured once per setting and shared by both targets.

Settings: `small` is batch 1 (sequence-like dims 128) unless the manifest says otherwise; `large`
doubles the batch-like dims until the estimated peak before fusion reaches 16 MiB (at most 65536),
again unless the manifest gives it. A model without symbolic dims has one setting.

Each run is measured twice (measure_peak): resident (VmHWM) and, where memray is installed (the
`bench` extra), allocated (the C allocator's exact high-water mark). Writes memory_truth.json and
memory_truth.md: estimate / measured per case and measurement, measured after / before (the "never
worse" figure) and a summary per measurement: worst ratio, cases within 15% among those whose
measured peak is at least 1 MiB, outliers; and per family (group), before and after fusion apart.
The causes found for outliers, written by hand in
memory_truth_notes.md beside the results, go under the summary;
`--render benchmarks/results/memory_truth.json` rewrites the Markdown from a run's JSON and the
notes without measuring again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from branchy_models import parallel_qkv_transformer, randwire  # noqa: E402 - the benchmarks' own builders
from recurrent_models import RECURRENT  # noqa: E402

from fuse_cli import api  # noqa: E402
from fuse_cli.analysis.measure import measure_peak  # noqa: E402
from fuse_cli.analysis.memory import profile_memory  # noqa: E402
from fuse_cli.analysis.shapes import infer_shapes  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from fuse_cli.input_domain import free_symbols, with_computed_dims  # noqa: E402

MIB = 1 << 20
LARGE_PEAK = 16 * MIB
MAX_BATCH = 1 << 16
TOLERANCE = 0.15
MIN_MEASURED = MIB
# every corpus the make targets build (`make bench-corpus`, `make quantized-bench`; the wheel corpus)
CORPUS_DIRS = [Path(p) for p in os.environ.get("FUSE_CORPUS_DIRS", "").split(":") if p] or [
    REPO / "benchmarks" / "corpus" / name
    for name in ("models", "heldout-models", "decoder-models", "decoder-models-fp16", "control-flow-models",
                 "wheel-models")
] + [REPO / "build" / "quantized-models"]
SEQUENCE_WORDS = ("seq", "length", "len", "token", "time")


@dataclass
class Case:
    model: str
    group: str
    target: str
    setting: str
    dims: dict
    input_shapes: dict = field(default_factory=dict)
    estimate_before: int | None = None
    estimate_after: int | None = None
    measured_before: int | None = None
    measured_after: int | None = None
    # the allocator's exact high-water mark (memray), where it is installed
    allocated_before: int | None = None
    allocated_after: int | None = None
    nodes_before: int | None = None
    nodes_after: int | None = None
    peak_node_before: str = ""
    peak_node_after: str = ""
    error: str = ""
    seconds: float = 0.0

    def ratios(self) -> dict:
        def ratio(a, b):
            return round(a / b, 3) if a is not None and b else None
        return {"before": ratio(self.estimate_before, self.measured_before),
                "after": ratio(self.estimate_after, self.measured_after),
                "measured_after_over_before": ratio(self.measured_after, self.measured_before),
                "before_allocated": ratio(self.estimate_before, self.allocated_before),
                "after_allocated": ratio(self.estimate_after, self.allocated_after),
                "allocated_after_over_before": ratio(self.allocated_after, self.allocated_before)}


@dataclass
class Model:
    path: Path
    group: str
    symbols: list[str]
    settings: dict = field(default_factory=dict)  # name -> dims
    int_ranges: dict = field(default_factory=dict)
    input_shapes: dict = field(default_factory=dict)  # whole input shapes, for dims with no name


def light_models_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def discover() -> Iterator[Model]:
    """The models, each corpus folder listed when the run reaches it (a corpus still being built
    gives what it has by then)."""
    models = [Model(p, "samples", []) for p in sorted((REPO / "sample_models").glob("*.onnx"))]
    models += [Model(p, "light-zoo", []) for p in sorted(light_models_dir().glob("light_*.onnx"))]
    models += [Model(p, "branchy", []) for p in built_branchy_models()]
    models += built_recurrent_models()
    yield from _with_symbols(models)
    for folder in CORPUS_DIRS:
        manifest = _read_manifest(folder / "manifest.json")
        for path in sorted(folder.glob("*.onnx")):
            model = Model(path, folder.name, [])
            _apply_manifest(model, manifest)
            yield from _with_symbols([model])


def _with_symbols(models: list[Model]) -> list[Model]:
    for model in models:
        model.symbols = _input_symbols(model.path)
    return models


def built_branchy_models() -> list[Path]:
    """The schedule benchmark's graphs built in code, saved into a folder of their own."""
    folder = Path(tempfile.mkdtemp(prefix="fuse-branchy-"))
    built = [(f"randwire-ws-seed{seed}", randwire(seed)) for seed in range(4)]
    built.append(("transformer-parallel-qkv", parallel_qkv_transformer()))
    paths = []
    for name, model in built:
        onnx.save(model, folder / f"{name}.onnx")
        paths.append(folder / f"{name}.onnx")
    return paths


def built_recurrent_models() -> list[Model]:
    """The GRU and LSTM models built in code (recurrent_models.py), with their small setting."""
    folder = Path(tempfile.mkdtemp(prefix="fuse-recurrent-"))
    models = []
    for name, (build, small, int_ranges) in RECURRENT.items():
        onnx.save(build(), folder / f"{name}.onnx")
        models.append(Model(folder / f"{name}.onnx", "recurrent", [], {"small": dict(small)}, dict(int_ranges)))
    return models


def _read_manifest(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("files", data.get("models", data)) if isinstance(data, dict) else data
    if isinstance(entries, list):
        entries = {str(e.get("file") or e.get("name")): e for e in entries if isinstance(e, dict)}
    return entries if isinstance(entries, dict) else {}


def _apply_manifest(model: Model, manifest: dict) -> None:
    """Tolerant of the manifest's layout: an entry per file name (or stem) holding `small` and
    `large` dims (directly, under `settings` or `shapes`, or as {"dims": ...}; non-integer values
    such as `activation_peak_mib` are ignored) and integer ranges (`inputs`: [{"name", "range"}],
    or `int_ranges` / `ranges`: name -> [low, high))."""
    entry = manifest.get(model.path.name) or manifest.get(model.path.stem)
    if not isinstance(entry, dict):
        return
    holder = entry.get("settings") or entry.get("shapes") or entry
    for name in ("small", "large"):
        value = holder.get(name) if isinstance(holder, dict) else None
        if isinstance(value, dict):
            dims = value.get("dims", value)
            model.settings[name] = {k: int(v) for k, v in dims.items() if isinstance(v, int)}
    # One setting only (the control-flow corpus's `bench`, the quantized corpus's `dims`): the
    # small one; the large one is derived. Whole input shapes bind dims that have no name.
    single = entry.get("bench") if isinstance(entry.get("bench"), dict) else entry
    if "small" not in model.settings and isinstance(single.get("dims"), dict):
        model.settings["small"] = {k: int(v) for k, v in single["dims"].items() if isinstance(v, int)}
    if isinstance(single.get("input_shapes"), dict):
        model.input_shapes = {k: [int(d) for d in v] for k, v in single["input_shapes"].items()}
    ranges = entry.get("int_ranges") or entry.get("ranges") or single.get("int_ranges") or {}
    inputs = entry.get("inputs")
    if isinstance(inputs, list):  # [{"name", "range": [low, high)}]
        ranges = {i["name"]: i["range"] for i in inputs if isinstance(i, dict) and i.get("range") and "name" in i}
    if isinstance(ranges, dict):
        model.int_ranges = {k: (int(v[0]), int(v[1])) for k, v in ranges.items()
                            if isinstance(v, (list, tuple)) and len(v) == 2
                            and all(isinstance(x, (int, float)) for x in v)}


def _input_symbols(path: Path) -> list[str]:
    """The free symbols: a dim written as arithmetic (`past_sequence + sequence`) is computed from
    them (with_computed_dims), never sized on its own."""
    return sorted(free_symbols(onnx.load(str(path), load_external_data=False)))


def _is_sequence(symbol: str) -> bool:
    return any(word in symbol.lower() for word in SEQUENCE_WORDS)


def settings_for(model: Model, m: onnx.ModelProto) -> dict[str, dict]:
    """The small and large free-symbol settings of `model` (`m`: its graph, weights not loaded)."""
    if model.settings.get("small") and model.settings.get("large"):
        return model.settings
    if not model.symbols or model.input_shapes:  # whole input shapes: one setting, as given
        return {"small": model.settings.get("small", {})}
    small = {**{s: 128 if _is_sequence(s) else 1 for s in model.symbols}, **model.settings.get("small", {})}
    if model.settings.get("large"):
        return {"small": small, "large": model.settings["large"]}
    large = dict(small)
    batch_like = [s for s in model.symbols if not _is_sequence(s)] or model.symbols
    planner = infer_shapes(m)
    while True:
        peak = profile_memory(m, infer_shapes(m, with_computed_dims(m, large), model.input_shapes),
                              symbolic_shapes=planner).peak_bytes
        if peak >= LARGE_PEAK or max(large[s] for s in batch_like) * 2 > MAX_BATCH:
            break
        for s in batch_like:
            large[s] *= 2
    # Already at 16 MiB at the small setting: a second setting would measure the same thing.
    return {"small": small} if large == small else {"small": small, "large": large}


def measure(model, dims: dict, int_ranges: dict, input_shapes: dict) -> tuple[int | None, int | None]:
    """(resident peak, allocated peak); either None where it cannot be measured here."""
    result = measure_peak(model, dims=dims, int_ranges=int_ranges, input_shapes=input_shapes)
    return result.peak_bytes, result.allocated_bytes


def run_model(model: Model, targets: list[str], wanted_settings: list[str]) -> list[Case]:
    cases = []
    proto = onnx.load(str(model.path), load_external_data=False)
    try:
        settings = settings_for(model, proto)
    except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the run
        return [Case(model.path.stem, model.group, t, "small", {}, model.input_shapes, error=f"settings: {exc}")
                for t in targets]
    for setting, free in settings.items():
        if setting not in wanted_settings:
            continue
        dims = with_computed_dims(proto, free)
        shapes = model.input_shapes
        try:
            measured_before, allocated_before = measure(model.path, dims, model.int_ranges, shapes)
        except Exception as exc:  # noqa: BLE001 - one model's failure is a row, not the end of the run
            cases += [Case(model.path.stem, model.group, t, setting, dims, shapes, error=f"measure before: {exc}")
                      for t in targets]
            continue
        for target in targets:
            case = Case(model.path.stem, model.group, target, setting, dims, shapes, measured_before=measured_before,
                        allocated_before=allocated_before)
            t0 = time.perf_counter()
            try:
                config = FuseConfig(target=target, dims=dims, verify=False, int_ranges=model.int_ranges,
                                    input_shapes={k: tuple(v) for k, v in shapes.items()})
                result = api.optimize(model.path, config, dry_run=True)
                memory = result.report.memory
                case.estimate_before, case.estimate_after = memory.before.peak_bytes, memory.after.peak_bytes
                case.peak_node_before, case.peak_node_after = memory.before.peak_node, memory.after.peak_node
                case.nodes_before, case.nodes_after = result.report.nodes_before, result.report.nodes_after
                case.measured_after, case.allocated_after = measure(result.model, dims, model.int_ranges, shapes)
            except Exception as exc:  # noqa: BLE001
                case.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            case.seconds = round(time.perf_counter() - t0, 1)
            cases.append(case)
            print(_line(case), file=sys.stderr, flush=True)
    return cases


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.2f}"


def _line(case: Case) -> str:
    r = case.ratios()
    return (f"{case.model} {case.target} {case.setting}: est/meas before {_mib(case.estimate_before)}/"
            f"{_mib(case.measured_before)} ({r['before']}), after {_mib(case.estimate_after)}/"
            f"{_mib(case.measured_after)} ({r['after']}); allocated {_mib(case.allocated_before)}/"
            f"{_mib(case.allocated_after)} ({r['before_allocated']}/{r['after_allocated']}) {case.error}")


def summary(cases: list[Case]) -> dict:
    """The calibration figures against each measurement: `resident` (VmHWM, the default) and
    `allocated` (memray's exact figure, where it was measured), plus the errors."""
    return {**agreement(cases, "measured"), "allocated": agreement(cases, "allocated"),
            "errors": [{"model": c.model, "target": c.target, "setting": c.setting, "error": c.error}
                       for c in cases if c.error]}


def agreement(cases: list[Case], kind: str) -> dict:
    """Each (case, before|after) is one comparison; counted where the `kind` peak >= 1 MiB."""
    rows = []
    for case in cases:
        for side in ("before", "after"):
            estimate, measured = getattr(case, f"estimate_{side}"), getattr(case, f"{kind}_{side}")
            if estimate is None or not measured:
                continue
            rows.append({"model": case.model, "group": case.group, "target": case.target, "setting": case.setting,
                         "side": side, "estimate": estimate, "measured": measured, "ratio": estimate / measured})
    # "before" is the same model for both targets: count it once (a model by group and name: the fp16
    # decoder corpus names its files as the fp32 one does).
    seen, unique = set(), []
    for row in rows:
        key = (row["group"], row["model"], row["setting"], row["side"], row["target"] if row["side"] == "after" else "")
        if key not in seen:
            seen.add(key)
            unique.append(row)
    big = [r for r in unique if r["measured"] >= MIN_MEASURED]
    within = [r for r in big if abs(r["ratio"] - 1) <= TOLERANCE]
    outliers = sorted((r for r in big if abs(r["ratio"] - 1) > TOLERANCE), key=lambda r: -abs(r["ratio"] - 1))
    worst = max(big, key=lambda r: abs(r["ratio"] - 1), default=None)
    pairs = [(c, getattr(c, f"{kind}_before"), getattr(c, f"{kind}_after")) for c in cases]
    never_worse = sorted(
        ({"model": c.model, "target": c.target, "setting": c.setting,
          "measured_after_over_before": round(after / before, 3)}
         for c, before, after in pairs if after and before and before >= MIN_MEASURED and after / before > 1.02),
        key=lambda r: -r["measured_after_over_before"])
    return {
        "comparisons_at_least_1_mib": len(big),
        "within_15_percent": len(within),
        "worst": None if worst is None else {**worst, "ratio": round(worst["ratio"], 3)},
        "outliers": [{**r, "ratio": round(r["ratio"], 3)} for r in outliers],
        "measured_after_over_before_above_1_02": never_worse,
        "after_over_before_max": max((round(after / before, 3) for _, before, after in pairs
                                      if after and before and before >= MIN_MEASURED), default=None),
    }


def families(cases: list[Case], kind: str = "allocated") -> list[dict]:
    """Per group (corpus folder or built family): its models, and per side (before / after fusion)
    the comparisons with a `kind` peak of 1 MiB or more, how many are within 15%, and the worst
    ratio (the one furthest from 1)."""
    rows = []
    for group in dict.fromkeys(c.group for c in cases):
        members = [c for c in cases if c.group == group]
        row = {"family": group, "models": len({c.model for c in members})}
        for side, part in agreement_by_side(members, kind).items():
            row[side] = part
        rows.append(row)
    return rows


def agreement_by_side(cases: list[Case], kind: str) -> dict[str, dict]:
    """agreement()'s count and worst for the before and the after comparisons apart."""
    both = {"before": [], "after": []}
    for case in cases:
        for side in both:
            estimate, measured = getattr(case, f"estimate_{side}"), getattr(case, f"{kind}_{side}")
            if estimate is None or not measured or measured < MIN_MEASURED:
                continue
            key = (case.model, case.setting, case.target if side == "after" else "")
            both[side].append((key, estimate / measured))
    result = {}
    for side, rows in both.items():
        ratios = list(dict(rows).values())  # "before" is one model for both targets: counted once
        worst = max(ratios, key=lambda r: abs(r - 1), default=None)
        result[side] = {"cases": len(ratios), "within": sum(abs(r - 1) <= TOLERANCE for r in ratios),
                        "worst": None if worst is None else round(worst, 3)}
    return result


def _family_table(cases: list[Case]) -> list[str]:
    lines = ["| family | models | before: cases >= 1 MiB | within 15% | worst | after: cases >= 1 MiB "
             "| within 15% | worst |", "|---|---|---|---|---|---|---|---|"]
    for row in families(cases):
        b, a = row["before"], row["after"]
        lines.append(f"| {row['family']} | {row['models']} | {b['cases']} | {b['within']} | {b['worst'] or '-'} "
                     f"| {a['cases']} | {a['within']} | {a['worst'] or '-'} |")
    return lines


def markdown(cases: list[Case], result: dict, seconds: float, notes: str = "") -> str:
    allocated = result.get("allocated") or {}
    lines = [
        "# fuse's peak-memory estimate against onnxruntime's measured peak",
        "",
        f"`benchmarks/memory_truth.py`, {seconds:.0f} s. onnx {onnx.__version__}, onnxruntime "
        f"{_ort_version()}, CPU, graph optimizations, arena and memory pattern off, one thread.",
        "Ratio = estimate / measured; the summary counts each distinct model once per side "
        "(before fusion is the same model for both targets) where the measured peak is >= 1 MiB.",
        "Two measurements of each run: *resident* (VmHWM - VmRSS, glibc's mmap threshold at 16 KiB) and "
        "*allocated* (the C allocator's high-water mark, memray: exact bytes).",
        "",
        f"- Resident: **{result['within_15_percent']} of {result['comparisons_at_least_1_mib']} within 15%**; "
        f"worst: {_worst(result)}; measured after / before at most {result.get('after_over_before_max')}",
    ]
    if allocated.get("comparisons_at_least_1_mib"):
        lines.append(f"- Allocated: **{allocated['within_15_percent']} of {allocated['comparisons_at_least_1_mib']} "
                     f"within 15%**; worst: {_worst(allocated)}; allocated after / before at most "
                     f"{allocated.get('after_over_before_max')}")
    lines += [
        "",
        "Per family, against the allocator (allocated bytes):",
        "",
        *_family_table(cases),
        "",
        *([notes.strip(), ""] if notes.strip() else []),
        "| model | group | target | setting | dims | est before | meas before | ratio | alloc before | ratio "
        "| est after | meas after | ratio | alloc after | ratio | meas after/before | alloc after/before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        r = c.ratios()
        dims = " ".join(f"{k}={v}" for k, v in c.dims.items())
        lines.append(f"| {c.model} | {c.group} | {c.target} | {c.setting} | {dims} | {_mib(c.estimate_before)} "
                     f"| {_mib(c.measured_before)} | {r['before'] or '-'} | {_mib(c.allocated_before)} "
                     f"| {r.get('before_allocated') or '-'} | {_mib(c.estimate_after)} "
                     f"| {_mib(c.measured_after)} | {r['after'] or '-'} | {_mib(c.allocated_after)} "
                     f"| {r.get('after_allocated') or '-'} | {r['measured_after_over_before'] or '-'} "
                     f"| {r.get('allocated_after_over_before') or '-'} |"
                     + (f" {c.error}" if c.error else ""))
    lines += ["", "Sizes in MiB."]
    for title, part in (("resident", result), ("allocated", allocated)):
        if not part.get("comparisons_at_least_1_mib"):
            continue
        lines += ["", f"## Outliers, {title} (measured >= 1 MiB, off by more than 15%)", ""]
        lines += [f"- {o['model']} {o['target']} {o['setting']} {o['side']}: {o['ratio']} "
                  f"({_mib(o['estimate'])} / {_mib(o['measured'])} MiB)" for o in part["outliers"]] or ["- none"]
        lines += ["", f"## {title.capitalize()} after / before above 1.02 (fusion made the real peak worse)", ""]
        lines += [f"- {o['model']} {o['target']} {o['setting']}: {o['measured_after_over_before']}"
                  for o in part["measured_after_over_before_above_1_02"]] or ["- none"]
    if result["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e['model']} {e['target']} {e['setting']}: {e['error']}"
                                          for e in result["errors"]]
    return "\n".join(lines) + "\n"


def _worst(part: dict) -> str:
    worst = part.get("worst")
    if not worst:
        return "none"
    return f"{worst['model']} {worst['target']} {worst['setting']} {worst['side']} {worst['ratio']}"


def _ort_version() -> str:
    import onnxruntime
    return onnxruntime.__version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated model names (file stems) or groups")
    parser.add_argument("--targets", default="onnx,ort-cpu")
    parser.add_argument("--settings", default="small,large")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--render", type=Path, nargs="+", metavar="JSON",
                        help="rewrite the Markdown from a run's JSON (several: the runs of parts of the models "
                             "joined into one, written beside the first)")
    args = parser.parse_args(argv)
    if args.render:
        documents = [json.loads(path.read_text()) for path in args.render]
        cases = [Case(**{k: v for k, v in c.items() if k != "ratios"}) for d in documents for c in d["cases"]]
        print(write(args.render[0].parent, cases, sum(d["seconds"] for d in documents)))
        return 0
    only = {n for n in args.only.split(",") if n}
    targets = [t for t in args.targets.split(",") if t]
    wanted = [s for s in args.settings.split(",") if s]
    started = time.perf_counter()
    cases: list[Case] = []
    args.out.mkdir(parents=True, exist_ok=True)
    for model in discover():
        if only and model.path.stem not in only and model.group not in only:
            continue
        cases += run_model(model, targets, wanted)
        write(args.out, cases, time.perf_counter() - started)  # after each model: a long run keeps what it did
    print(write(args.out, cases, time.perf_counter() - started))
    return 0


def write(folder: Path, cases: list[Case], seconds: float) -> str:
    result = summary(cases)
    document = {"schema_version": 1, "seconds": round(seconds, 1), "onnx": onnx.__version__,
                "onnxruntime": _ort_version(), "summary": result,
                "cases": [{**asdict(c), "ratios": c.ratios()} for c in cases]}
    (folder / "memory_truth.json").write_text(json.dumps(document, indent=1) + "\n")
    notes = folder / "memory_truth_notes.md"
    text = markdown(cases, result, seconds, notes.read_text() if notes.exists() else "")
    (folder / "memory_truth.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
