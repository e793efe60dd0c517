"""Horizontal MatMul merge: is one MatMul against concatenated weights + Split faster than the
MatMuls that read one input (attention's Q/K/V, a gated MLP's two projections)?

onnx-simplifier's output of the held-out T5 encoder has the three Q/K/V MatMuls of each layer merged
into one MatMul and a Split (3 nodes fewer than fuse's output). fuse has no such pass. This script
measures the form on fuse's own output of each model given:

    x ─┬─ MatMul(W1) ─ y1            x ─ MatMul([W1 | W2 | ...]) ─ Split(axis -1) ─ y1, y2, ...
       └─ MatMul(W2) ─ y2      =>

every group of two or more MatMuls that read one tensor with constant 2-D weights of one row count
is merged. Timing: onnxruntime CPU, one thread, CPU time of the calling thread, the original, a
second session of it (the noise floor), fuse's output and the merged form timed in alternating
rounds (fuse_cli.bench.time_sessions), three repeats at graph optimizations disabled and at
ORT_ENABLE_ALL, at batch 1 x sequence 128; integer inputs in the ranges the graph implies.
Peak: fuse_cli.analysis.measure.measure_peak (child process, arena and memory pattern off).

    .venv/bin/python benchmarks/qkv_merge.py MODEL.onnx [...] [--out benchmarks/results/qkv_merge.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli import api  # noqa: E402
from fuse_cli.analysis.measure import measure_peak  # noqa: E402
from fuse_cli.bench import Timing, feeds_for, make_session, random_inputs_for, time_sessions  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from fuse_cli.input_domain import integer_ranges  # noqa: E402

DIMS = {"batch": 1, "sequence": 128}
REPEATS = 3


def merged(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """`model` with each group of MatMuls that read one input with constant [K, N_i] weights as one
    MatMul and a Split; the number of groups merged."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights and len(weights[node.input[1]].dims) == 2:
            readers.setdefault(node.input[0], []).append(node)
    groups = [nodes for nodes in readers.values()
              if len(nodes) > 1 and len({weights[n.input[1]].dims[0] for n in nodes}) == 1]
    first = {id(nodes[0]): (i, nodes) for i, nodes in enumerate(groups)}
    dropped = {id(n) for nodes in groups for n in nodes}
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) in first:
            i, nodes = first[id(node)]
            parts = [numpy_helper.to_array(weights[n.input[1]]) for n in nodes]
            graph.initializer.extend([numpy_helper.from_array(np.concatenate(parts, axis=1), f"merged_{i}_weight"),
                                      numpy_helper.from_array(np.array([p.shape[1] for p in parts], np.int64),
                                                              f"merged_{i}_split")])
            kept.append(helper.make_node("MatMul", [node.input[0], f"merged_{i}_weight"], [f"merged_{i}_out"],
                                         name=f"merged_{i}_matmul"))
            kept.append(helper.make_node("Split", [f"merged_{i}_out", f"merged_{i}_split"],
                                         [n.output[0] for n in nodes], axis=-1, name=f"merged_{i}_split"))
        elif id(node) not in dropped:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return model, len(groups)


def ratios(original: Path, candidates: dict[str, Path], level: str) -> dict[str, list[float]]:
    ranges = integer_ranges(onnx.load(str(original), load_external_data=False))
    timing = Timing(min_samples=40, max_samples=40, min_seconds=0.0, sample_seconds=0.01)
    found: dict[str, list[float]] = {name: [] for name in ("noise", *candidates)}
    for _ in range(REPEATS):
        paths = {"original": original, "noise": original, **candidates}
        sessions = {name: make_session(str(path), level=level) for name, path in paths.items()}
        feeds = random_inputs_for(sessions["original"], dims=DIMS, seed=0, int_ranges=ranges)
        latencies = time_sessions(sessions, {n: feeds_for(s, feeds, dims=DIMS, int_ranges=ranges)
                                             for n, s in sessions.items()}, timing)
        base = latencies["original"].cpu_median_ms
        for name in found:
            found[name].append(latencies[name].cpu_median_ms / base)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "qkv_merge.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="qkv-merge-") as scratch:
        for source in args.models:
            fused_path = Path(scratch) / f"{source.stem}.fused.onnx"
            api.optimize(source, FuseConfig(), fused_path)
            model, groups = merged(onnx.load(str(fused_path)))
            merged_path = Path(scratch) / f"{source.stem}.merged.onnx"
            onnx.save(model, merged_path)
            nodes = [len(onnx.load(str(p), load_external_data=False).graph.node) for p in (fused_path, merged_path)]
            times = {level: ratios(source, {"fuse": fused_path, "merged": merged_path}, level)
                     for level in ("disabled", "all")}
            ranges = {k: v for k, v in integer_ranges(onnx.load(str(source), load_external_data=False)).items() if v}
            peaks = [measure_peak(p, dims=DIMS, int_ranges=ranges).peak_bytes for p in (fused_path, merged_path)]
            rows.append((source.stem, groups, nodes, times, peaks))
            print(source.stem, groups, nodes, times, peaks, flush=True)
    lines = ["# Horizontal MatMul merge (MatMul + Split) against fuse's output", "",
             "Produced by `benchmarks/qkv_merge.py` (its docstring gives the method). CPU time over the original's,",
             f"median per repeat ({REPEATS} repeats, min - max), batch 1 x sequence 128; peak in MiB.", "",
             "| model | groups merged | nodes fuse / merged | noise disabled | fuse disabled | merged disabled "
             "| noise all | fuse all | merged all | peak fuse / merged |",
             "|---|---:|---|---|---|---|---|---|---|---|"]

    def span(values: list[float]) -> str:
        return f"{min(values):.3f} - {max(values):.3f}"

    for name, groups, nodes, times, peaks in rows:
        cells = [span(times[level][tool]) for level in ("disabled", "all") for tool in ("noise", "fuse", "merged")]
        peak = " / ".join("-" if p is None else f"{p / 2**20:.1f}" for p in peaks)
        lines.append(f"| {name} | {groups} | {nodes[0]} / {nodes[1]} | " + " | ".join(cells) + f" | {peak} |")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
