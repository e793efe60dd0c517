"""Where a model's time goes, by operator type, before and after fuse: the bound on what fusion
can save.

    .venv/bin/python benchmarks/op_profile.py MODEL.onnx [...] [--target onnx,ort-cpu] [--dim batch=8]
                                               [--runs 10] [--out benchmarks/results/op_profile.md]

Each model runs in onnxruntime CPU exactly as `make bench` times it (one intra-op thread, graph
optimizations disabled), with onnxruntime's own profiler on. The per-node kernel times of the
timed runs (the first, warm-up run left out) are summed by operator type. A fusion can at best
remove the time of the operators it folds away (BatchNormalization, an activation, a bias Add):
when Conv/Gemm/MatMul hold 95% of the time, no rewrite at the graph level makes the model more
than ~5% faster, whatever it fuses. The fused model's row shows what is left.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_DIMS = {"batch": 8, "sequence": 128}
HEAVY_OPS = {"Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul", "FusedMatMul",
             "MultiHeadAttention", "Attention"}


def op_times(path: Path, dims: dict[str, int], runs: int) -> dict[str, float]:
    """Microseconds per run by operator type (kernel time of the timed runs, mean)."""
    import onnxruntime as ort

    from fuse_cli.bench import random_inputs_for

    with tempfile.TemporaryDirectory(prefix="fuse-profile-") as scratch:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(scratch) / "profile")
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds = random_inputs_for(session, dims=dims, seed=0)
        for _ in range(runs + 1):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    return _mean_by_op(events, runs)


def _mean_by_op(events: list[dict], runs: int) -> dict[str, float]:
    """Kernel time per op type over all runs but the first, per run."""
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(starts) < 2:
        raise RuntimeError("the profile holds fewer than two runs")
    after_warmup = starts[1]
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if (event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time")
                and event["ts"] >= after_warmup):
            totals[event["args"]["op_name"]] += event["dur"]
    return {op: microseconds / runs for op, microseconds in totals.items()}


def fused(path: Path, target: str, scratch: Path) -> Path:
    from fuse_cli import api
    from fuse_cli.config import FuseConfig

    out = scratch / f"{path.stem}.{target}.onnx"
    api.optimize(path, FuseConfig(target=target, verify=False), out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--target", default="onnx,ort-cpu", help="fuse targets to profile too (comma-separated)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "op_profile.md")
    args = parser.parse_args(argv)
    dims = dict(DEFAULT_DIMS)
    for item in args.dim:
        key, _, value = item.partition("=")
        dims[key] = int(value)
    targets = [t for t in args.target.split(",") if t]

    lines = ["# Where the time goes, by operator type", "",
             f"onnxruntime CPU, one thread, graph optimizations disabled, dims {dims}, mean kernel time of "
             f"{args.runs} runs after a warm-up. Heavy = {', '.join(sorted(HEAVY_OPS))}. 'Bound' is the "
             "time ratio a fusion that removed every other operator would reach.", "",
             "| Model | Form | Total ms | Heavy share | Bound | Largest other operators (ms) |",
             "|---|---|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory(prefix="fuse-op-profile-") as scratch_name:
        scratch = Path(scratch_name)
        for path in args.models:
            base_total = None
            for form in ["original", *targets]:
                model = path if form == "original" else fused(path, form, scratch)
                times = op_times(model, dims, args.runs)
                total = sum(times.values())
                heavy = sum(t for op, t in times.items() if op in HEAVY_OPS)
                base_total = base_total or total
                others = sorted(((t, op) for op, t in times.items() if op not in HEAVY_OPS), reverse=True)[:4]
                shown = ", ".join(f"{op} {t / 1000:.2f}" for t, op in others)
                bound = heavy / base_total
                lines.append(f"| {path.stem if form == 'original' else ''} | {form} | {total / 1000:.1f} "
                             f"({total / base_total:.2f}x) | {heavy / total:.1%} | {bound:.2f} | {shown} |")
                print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
