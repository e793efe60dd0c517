"""The `schedule` pass on branchy models: fuse's output measured with and without it.

    .venv/bin/python benchmarks/schedule_bench.py [--out benchmarks/results/schedule.md] [--quick]
    FUSE_CORPUS_DIRS=dir1:dir2 ...   # adds the corpus models below where a folder has them

Groups: "branchy" (the light zoo's Inception v1/v2, DenseNet-121, SqueezeNet, ResNet-50,
ShuffleNet; from the corpus folders googlenet, inception-v3, densenet121, unet-small and
efficientvit-m0; a transformer block with parallel Q/K/V) and "randwire" (randomly wired networks:
32 nodes, Watts-Strogatz k=4 p=0.75, each node Relu-Conv3x3-BN over the sum of its inputs).
Per model: `fuse optimize --target ort-cpu --no-verify` twice, with and without `schedule`; the two
outputs run on the same seeded inputs (bitwise equal expected: same operators); the estimated
and the measured peak (fuse_cli.analysis.measure) of each; the pass's lower bound, method and time.
Symbolic batch dims are bound to 8 (peaks of tens of MiB, where measurement is reliable).
Then the 12k-node transformer stack (big_models.py): optimize time with and without `schedule`.
Goals (issue 16): geomean measured with/without <= 0.90 on "branchy", <= 0.80 on "randwire".
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from big_models import build_deep_stack  # noqa: E402
from branchy_models import parallel_qkv_transformer, randwire  # noqa: E402
from fuse_cli import api  # noqa: E402
from fuse_cli.analysis.measure import measure_peak  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from fuse_cli.verify import make_session, random_inputs  # noqa: E402

CORPUS_DIRS = [Path(p) for p in os.environ.get("FUSE_CORPUS_DIRS", "").split(":") if p]
CORPUS_NAMES = ("googlenet-opset17", "inception-v3-opset17", "densenet121-opset17", "unet-small-opset17",
                "efficientvit-m0-opset13")
LIGHT = ("light_inception_v1", "light_inception_v2", "light_densenet121", "light_squeezenet", "light_resnet50",
         "light_shufflenet")
BATCH = 8
TARGET = "ort-cpu"
MiB = 1024 * 1024


def models(seeds: int) -> list[tuple[str, str, onnx.ModelProto]]:
    light = Path(onnx.__file__).parent / "backend/test/data/light"
    found = [("branchy", name, onnx.load(str(light / f"{name}.onnx"))) for name in LIGHT
             if (light / f"{name}.onnx").exists()]
    for name in CORPUS_NAMES:
        path = next((folder / f"{name}.onnx" for folder in CORPUS_DIRS if (folder / f"{name}.onnx").exists()), None)
        if path is not None:
            found.append(("branchy", name, onnx.load(str(path))))
    found.append(("branchy", "transformer-parallel-qkv", parallel_qkv_transformer()))
    found += [("randwire", f"randwire-ws-seed{s}", randwire(s)) for s in range(seeds)]
    return found


def symbols(model: onnx.ModelProto) -> dict[str, int]:
    return {d.dim_param: BATCH for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}


def bitwise_equal(a: Path, b: Path, dims: dict[str, int]) -> bool:
    first, second = make_session(str(a)), make_session(str(b))
    feeds = random_inputs(first, dims=dims, seed=0)
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(first.run(None, feeds), second.run(None, feeds)))


def run_one(group: str, name: str, model: onnx.ModelProto, work: Path, rule: str = "onnxruntime") -> dict:
    """rule "onnxruntime": ordered for and measured in onnxruntime's default walk; "stored":
    ordered for runtimes that run the file's order (--schedule-for stored) and measured so, in
    onnxruntime's PRIORITY_BASED order, which keeps the stored order."""
    source = work / f"{name}.onnx"
    onnx.save(model, source)
    dims = symbols(model)
    config = FuseConfig(target=TARGET, verify=False, dims=dims, schedule_for=rule)
    paths = {"with": work / f"{name}.{rule}.with.onnx", "without": work / f"{name}.{rule}.without.onnx"}
    reports = {"with": api.optimize(source, config, paths["with"]).report,
               "without": api.optimize(source, config.with_overrides(disable=("schedule",)), paths["without"]).report}
    # No record: the peak guard took the pass back (its order raised onnxruntime's estimated peak,
    # which an onnxruntime target never allows, whatever the order was chosen for).
    record = reports["with"].orders[0] if reports["with"].orders else None
    # the pass's own estimates under `rule` at the bound dims (the report's memory is onnxruntime's walk)
    est_without = (record.peaks_before[0][0] if record and record.peaks_before
                   else reports["without"].memory.after.peak_bytes)
    est_with = record.peaks_after[0][0] if record and record.peaks_after else est_without
    row = {"group": group, "model": name, "rule": rule, "nodes": reports["with"].nodes_after,
           "est_without": est_without, "est_with": est_with,
           "lower_bound": record.lower_bound if record else 0, "method": record.method if record else "guard",
           "seconds": record.seconds if record else 0.0,
           "equal": bitwise_equal(paths["with"], paths["without"], dims)}
    stored = rule == "stored"
    row["meas_without"] = measure_peak(paths["without"], dims=dims, stored_order=stored).exact_or_resident_bytes
    row["meas_with"] = (measure_peak(paths["with"], dims=dims, stored_order=stored).exact_or_resident_bytes
                        if record and record.changed else row["meas_without"])
    print(f"{group:9} {name:26} {rule:11} est {row['est_without'] / MiB:8.2f} -> {row['est_with'] / MiB:8.2f} MiB  "
          f"meas {_mib(row['meas_without'])} -> {_mib(row['meas_with'])}  LB {row['lower_bound'] / MiB:7.2f}  "
          f"{row['seconds']:5.2f} s  {row['method']}  equal={row['equal']}", file=sys.stderr, flush=True)
    return row


def stack_times(work: Path, blocks: int) -> list[dict]:
    """`fuse optimize --no-verify` of the deep stack with and without `schedule`, per target."""
    path = work / "deep_stack.onnx"
    onnx.save(build_deep_stack(blocks), path)
    rows = []
    for target in ("ort-cpu", "onnx"):
        config = FuseConfig(target=target, verify=False, dims={"batch": 1, "sequence": 128})
        times = {}
        for label, cfg in (("without", config.with_overrides(disable=("schedule",))), ("with", config)):
            start = time.perf_counter()
            report = api.optimize(path, cfg, work / "deep_stack.fused.onnx").report
            times[label] = time.perf_counter() - start
        record = report.orders[0]
        rows.append({"target": target, "nodes": report.nodes_after, "without": times["without"], "with": times["with"],
                     "pass": record.seconds, "method": record.method, "reason": record.reason})
        print(f"stack {target}: {report.nodes_before} -> {report.nodes_after} nodes, optimize {times['without']:.1f} s "
              f"-> {times['with']:.1f} s, pass {record.seconds:.2f} s ({record.method})", file=sys.stderr, flush=True)
    return rows


METHOD = """## Method and its exactness

The pass (fuse_cli/passes/schedule.py, fuse_cli/scheduling/) changes only the stored node order. Candidates:
Liu's rule over walks (the optimal post-order on trees, linear); Serenity's dynamic program over run sets
(exact among orders that keep single-reader chains contiguous, under the search's sizing, when no layer
holds more than 256 states; a beam search beyond, reported as `dp-beam`); a local search over walks
(which producer a join explores first). For onnxruntime each candidate is stored so that onnxruntime's
reverse-DFS walk reproduces it (exact where branches share only visited nodes; the judged order is always
onnxruntime's replayed order, checked against its profiler in tests). Every candidate is judged by the
peak guard's own estimate at the bound dims and at the guard's larger setting; it is taken only if it is
never worse at either and at least 256 KiB and 1% better at the bound dims (the resident measurement
reads up to a few hundred KiB off below a few MiB; onnxruntime's profiler runs exactly the replayed
order). When the input order's estimate is within that gain of the lower bound, no
search runs. Time cap 2 s (the judge's runs of the memory model included); a candidate not judged in time
is not taken."""


def _mib(value: int | None) -> str:
    return "   n/a" if value is None else f"{value / MiB:6.2f}"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: list[dict], stack: list[dict], seconds: float) -> str:
    lines = [f"# `schedule`: fuse's output with and without the pass (target {TARGET}, batch {BATCH})", "",
             METHOD, "",
             "One run of `benchmarks/schedule_bench.py` (`make bench`), "
             f"{seconds:.0f} s on a shared 2-core machine. Estimated: the peak guard's estimate in onnxruntime's "
             "order. Measured: `measure_peak` (onnxruntime CPU, arena and memory pattern off, one thread; the "
             "allocator's exact high-water mark, memray). "
             "Lower bound: no order's estimated peak is below it (each node's inputs + outputs + scratch, the "
             "caller's inputs, the graph outputs at the end). Outputs: the two optimized models on the same "
             "seeded inputs, bitwise.", "",
             "Order rule: `onnxruntime` is ordered for (--schedule-for onnxruntime) and measured in onnxruntime's "
             "default reverse depth-first walk; `stored` is ordered for runtimes that run the file's order "
             "(--schedule-for stored) and measured so, in onnxruntime's PRIORITY_BASED order (Kahn's, ties in "
             "stored order: the stored order itself).", "",
             "| group | model | order rule | nodes | est. without MiB | est. with MiB | lower bound MiB | meas. "
             "without MiB | meas. with MiB | meas. ratio | pass s | method | outputs bitwise equal |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        ratio = r["meas_with"] / r["meas_without"] if r["meas_without"] and r["meas_with"] else None
        lines.append(f"| {r['group']} | {r['model']} | {r.get('rule', 'onnxruntime')} | {r['nodes']} | "
                     f"{r['est_without'] / MiB:.2f} | "
                     f"{r['est_with'] / MiB:.2f} | {r['lower_bound'] / MiB:.2f} | {_mib(r['meas_without']).strip()} | "
                     f"{_mib(r['meas_with']).strip()} | {'' if ratio is None else f'{ratio:.3f}'} | {r['seconds']:.2f} "
                     f"| {r['method']} | {'yes' if r['equal'] else 'NO'} |")
    lines += ["", "| group | order rule | models | reordered | geomean est. with/without | geomean meas. with/without "
              "| max meas. ratio | geomean lower bound / without (best any order could do) | goal |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for (group, goal), rule in itertools.product((("branchy", 0.90), ("randwire", 0.80)), ("onnxruntime", "stored")):
        mine = [r for r in rows if r["group"] == group and r.get("rule", "onnxruntime") == rule]
        if not mine:
            continue
        est = geomean([r["est_with"] / r["est_without"] for r in mine])
        meas = [r["meas_with"] / r["meas_without"] for r in mine if r["meas_without"] and r["meas_with"]]
        bound = geomean([min(1.0, r["lower_bound"] / r["est_without"]) for r in mine if r["lower_bound"]])
        lines.append(f"| {group} | {rule} | {len(mine)} | {sum(r['method'] not in ('kept', 'guard') for r in mine)} "
                     f"| {est:.3f} | {geomean(meas):.3f} | {max(meas, default=float('nan')):.3f} | {bound:.3f} "
                     f"| <= {goal} |")
    lines += ["", "12k-node transformer stack (`big_models.build_deep_stack`), `fuse optimize --no-verify` at "
              "batch 1, sequence 128:", "",
              "| target | nodes after | optimize without s | optimize with s | pass s | pass outcome |",
              "|---|---:|---:|---:|---:|---|"]
    for s in stack:
        lines.append(f"| {s['target']} | {s['nodes']} | {s['without']:.1f} | {s['with']:.1f} | {s['pass']:.2f} | "
                     f"{s['method']}: {s['reason'] or 'reordered'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=245, help="encoder blocks in the deep stack (12k nodes)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/schedule.md"))
    parser.add_argument("--models", default=None, metavar="A,B", help="only these models (names as in the table)")
    parser.add_argument("--rules", default="onnxruntime,stored", help="order rules to schedule for and measure in")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        wanted = set(args.models.split(",")) if args.models else None
        rules = args.rules.split(",")
        rows = [run_one(group, name, model, work, rule) for group, name, model in models(args.seeds)
                for rule in rules if wanted is None or name in wanted]
        stack = stack_times(work, args.blocks) if args.blocks else []
    text = markdown(rows, stack, time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
