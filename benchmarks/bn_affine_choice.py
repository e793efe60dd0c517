"""Is a standalone BatchNormalization faster or slower than the Mul + Add it could become?

Times both forms of y = x * scale + shift (per channel, axis 1) in onnxruntime CPU with one
intra-op thread, graph optimizations disabled and enabled. The two sessions of a shape are timed
in alternating rounds so that load from other processes hits both alike; each figure is the
median over all runs. The bn-affine pass's docstring records the result and the choice it led to.

    .venv/bin/python benchmarks/bn_affine_choice.py [--runs 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = ([1, 64, 56, 56], [8, 256, 14, 14], [1, 512, 7, 7], [32, 64, 28, 28])
LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "enabled": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def _model(shape: list[int], affine: bool):
    rng = np.random.default_rng(0)
    c = shape[1]
    gamma, beta, mean = (rng.uniform(-1, 1, c).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, c).astype(np.float32)
    if affine:
        scale = gamma / np.sqrt(var + 1e-5)
        shift = beta - mean * scale
        bshape = [c] + [1] * (len(shape) - 2)
        inits = [numpy_helper.from_array(scale.reshape(bshape), "scale"),
                 numpy_helper.from_array(shift.reshape(bshape), "shift")]
        nodes = [helper.make_node("Mul", ["x", "scale"], ["t"]), helper.make_node("Add", ["t", "shift"], ["y"])]
    else:
        inits = [numpy_helper.from_array(v, n) for v, n in ((gamma, "g"), (beta, "b"), (mean, "m"), (var, "v"))]
        nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=1e-5)]
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _session(model: bytes, level) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = level
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def measure(shape: list[int], level, runs: int, per_round: int = 10) -> tuple[float, float]:
    """Median microseconds per run: (BatchNormalization, Mul + Add)."""
    sessions = [_session(_model(shape, affine), level) for affine in (False, True)]
    feed = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    times: list[list[float]] = [[], []]
    for s in sessions:
        for _ in range(20):
            s.run(None, feed)
    for _ in range(runs // per_round):
        for s, out in zip(sessions, times):
            for _ in range(per_round):
                start = time.perf_counter()
                s.run(None, feed)
                out.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread, median of {args.runs} runs, fp32")
    print(f"{'shape':<18} {'optimizations':<13} {'BN us':>9} {'Mul+Add us':>11} {'Mul+Add/BN':>11}")
    for shape in SHAPES:
        for name, level in LEVELS.items():
            bn, affine = measure(shape, level, args.runs)
            print(f"{str(shape):<18} {name:<13} {bn:9.1f} {affine:11.1f} {affine / bn:11.2f}")


if __name__ == "__main__":
    main()
