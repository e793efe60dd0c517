"""Each opset-23 standard operator fuse emits for `--target onnx` (RMSNormalization,
RotaryEmbedding, Attention) against the decomposed form it replaces, on onnxruntime's CPU
provider, inside real decoder exports: the model fused with and without the one pass, timed
side by side in one run (rounds interleaved, the CPU being shared; median of the rounds' medians).

    python benchmarks/opset23_bench.py DECODER.onnx ... [--threads 1] [--rounds 7]

Variants, all at --upgrade-opset 23 with the rest of the onnx pipeline:
  decomposed      none of the three passes
  rms             + rms-norm                       (RMSNormalization vs Pow/ReduceMean/Sqrt/Div/Mul)
  rotary          + standard-rotary-embedding       (RotaryEmbedding vs Slice/Neg/Concat/Mul/Add)
  rotary+attn     + standard-attention              (Attention vs Reshape/Transpose/repeat_kv/MatMul/Softmax/...)
A prefill is timed at batch 1 x 128 tokens, a decode step at 1 token after 128 past ones."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.core.feeds import random_inputs
from fuse_cli.core.sessions import make_session

STANDARD = ("rms-norm", "standard-rotary-embedding", "standard-attention")
VARIANTS = {
    "decomposed": STANDARD,
    "rms": ("standard-rotary-embedding", "standard-attention"),
    "rotary": ("rms-norm", "standard-attention"),
    "rotary+attn": ("rms-norm",),
}
COMPARISONS = (("RMSNormalization", "rms", "decomposed"), ("RotaryEmbedding", "rotary", "decomposed"),
               ("Attention", "rotary+attn", "rotary"))


def dims_for(model: onnx.ModelProto) -> dict[str, int]:
    names = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    decode = any("past" in n for n in names)
    dims = {"batch": 1, "sequence": 1 if decode else 128, "past_sequence": 128}
    dims["past_sequence + sequence"] = dims["past_sequence"] + dims["sequence"] if decode else dims["sequence"]
    return {n: dims.get(n, 1) for n in names}


def variants(path: Path, work: Path) -> dict[str, tuple[onnx.ModelProto, int]]:
    made = {}
    for name, disabled in VARIANTS.items():
        config = FuseConfig(target="onnx", upgrade_opset=23, disable=disabled, verify=False, allow_peak_growth=True)
        result = api.optimize(path, config, work / f"{path.stem}.{name}.onnx")
        made[name] = (result.model, sum(n.op_type in ("RMSNormalization", "RotaryEmbedding", "Attention")
                                        for n in result.model.graph.node))
    return made


def time_once(session, feeds, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=30, help="runs per round (the round's median is kept)")
    args = parser.parse_args(argv)
    print("| model | operator | fused nodes | fused us | decomposed us | ratio (fused / decomposed) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for path in args.models:
            made = variants(path, Path(scratch))
            dims = dims_for(made["decomposed"][0])
            sessions = {name: make_session(model, dims=dims, threads=args.threads) for name, (model, _) in made.items()}
            feeds = random_inputs(sessions["decomposed"], dims=dims, seed=0)
            feeds = {k: np.ones_like(v) if "mask" in k else v for k, v in feeds.items()}  # no padding
            medians: dict[str, list[float]] = {name: [] for name in sessions}
            for session in sessions.values():
                time_once(session, feeds, 5)  # warm-up
            for round_ in range(args.rounds):
                order = list(sessions) if round_ % 2 == 0 else list(reversed(sessions))
                for name in order:
                    medians[name].append(time_once(sessions[name], feeds, args.runs))
            best = {name: statistics.median(values) * 1e6 for name, values in medians.items()}
            for op, fused, base in COMPARISONS:
                count = made[fused][1] - made[base][1]
                if count == 0:
                    print(f"| {path.stem} | {op} | 0 | | | not fused |")
                    continue
                print(f"| {path.stem} | {op} | {count} | {best[fused]:.0f} | {best[base]:.0f} | "
                      f"{best[fused] / best[base]:.3f} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
