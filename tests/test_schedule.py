"""The schedule pass: same operators and values, a stored order with a peak never above the input's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import profile_memory, runtime_order
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.schedule import _Dag, _Judge, _reordered, schedule
from fuse_cli.verify import make_session, random_inputs
from tests.graphs import GraphBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from schedule_bench import parallel_qkv_transformer, randwire  # noqa: E402


def two_branches(channels: int = 8, size: int = 64, wide: int = 64, out: int = 8, big_first: bool = False) -> onnx.ModelProto:
    """x -> Conv(out) = small;  x -> Conv(wide) -> Relu -> Conv(out) = big;  small + big.

    Stored small branch first (as written), onnxruntime runs the big branch... last when
    `big_first`: the stored index of the big branch's end is then the lower one."""
    b = GraphBuilder(opset=17)
    x = b.input("x", [1, channels, size, size])
    small = b.op("Conv", x, b.const(b.rand(out, channels, 1, 1)), name="small")
    big = b.op("Conv", x, b.const(b.rand(wide, channels, 1, 1)), name="expand")
    big = b.op("Relu", big, name="relu")
    big = b.op("Conv", big, b.const(b.rand(out, wide, 1, 1)), name="reduce")
    y = b.op("Add", big, small, name="join")
    model = b.build(y, output_names=["y"])
    if big_first:  # small stored last: onnxruntime explores it first and holds it over the big branch
        nodes = list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend([nodes[i] for i in (1, 2, 3, 0, 4)])
    return model


def peaks(model: onnx.ModelProto) -> dict[str, int]:
    shapes = infer_shapes(model, symbolic=True)
    judge = _Judge(model, shapes, infer_shapes(model), ())
    stored = list(range(len(model.graph.node)))
    return {rule: judge.peak(stored, rule) for rule in ("onnxruntime", "stored")}


def run(model: onnx.ModelProto) -> list[np.ndarray]:
    session = make_session(model)
    return session.run(None, random_inputs(session, seed=0))


def scheduled(model: onnx.ModelProto, rule: str):
    return schedule(model, infer_shapes(model, symbolic=True), infer_shapes(model), rule=rule)


def assert_same_graph(before: onnx.ModelProto, after: onnx.ModelProto) -> None:
    key = lambda n: n.SerializeToString(deterministic=True)  # noqa: E731
    assert sorted(map(key, before.graph.node)) == sorted(map(key, after.graph.node))
    onnx.checker.check_model(after)  # topologically sorted, among the rest
    for want, got in zip(run(before), run(after)):
        assert np.array_equal(want, got)


@pytest.mark.parametrize("rule, big_first", [("onnxruntime", True), ("stored", False)])
def test_branches_in_the_bad_order_are_reordered(rule, big_first):
    model = two_branches(big_first=big_first)
    result = scheduled(model, rule)
    assert result is not None
    assert result.peak_after[rule] < result.peak_before[rule]
    assert peaks(result.model)[rule] == result.peak_after[rule] < peaks(model)[rule]
    assert_same_graph(model, result.model)


@pytest.mark.parametrize("rule, big_first", [("onnxruntime", False), ("stored", True)])
def test_an_order_already_best_is_kept(rule, big_first):
    assert scheduled(two_branches(big_first=big_first), rule) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rule", ["onnxruntime", "stored", "both"])
def test_peak_never_above_the_input_order(seed, rule):
    model = randwire(seed, nodes=16, channels=4, size=16)
    before = peaks(model)
    result = scheduled(model, rule)
    if result is None:
        return
    after = peaks(result.model)
    for judged in (("onnxruntime", "stored") if rule == "both" else (rule,)):
        assert after[judged] <= before[judged]
        assert after[judged] == result.peak_after[judged]
    assert_same_graph(model, result.model)


def test_transformer_with_parallel_projections_keeps_its_values():
    model = parallel_qkv_transformer(seq=16, hidden=32, ffn=64)
    result = scheduled(model, "both")
    if result is not None:
        assert_same_graph(model, result.model)


def tree(depth: int = 3) -> onnx.ModelProto:
    """A binary tree of Adds over chains of Relu reading the graph input: branches share no node."""
    b = GraphBuilder(opset=17)
    x = b.input("x", [1, 4])

    def grow(level: int) -> str:
        if level == 0:
            return b.op("Relu", b.op("Neg", x))
        return b.op("Add", grow(level - 1), grow(level - 1))

    return b.build(grow(depth), output_names=["y"])


@pytest.mark.parametrize("seed", range(5))
def test_reversed_walk_is_what_onnxruntime_runs(seed):
    """The index trick: storing a walk with its sibling orders reversed makes onnxruntime's
    reverse depth-first walk (replayed, and as its profiler records it) that walk, where
    branches share no node (the module docstring's exactness condition)."""
    model = tree()
    dag = _Dag(model, infer_shapes(model), ())
    rank = list(np.random.default_rng(seed).permutation(len(dag.nodes)))
    post = [node for node, _ in dag.walk(rank)]
    reordered = _reordered(model, dag.stored_for_walk(post))
    names = [n.name for n in reordered.graph.node]
    replayed = [names[i] for i in runtime_order(reordered.graph)]
    assert replayed == [model.graph.node[i].name for i in post]
    assert profiled_order(reordered) == replayed


def test_profiler_runs_the_replayed_order_on_a_shared_graph():
    model = randwire(3, nodes=12, channels=2, size=4)
    result = scheduled(model, "onnxruntime")
    reordered = result.model if result is not None else model
    assert profiled_order(reordered) == [reordered.graph.node[i].name for i in runtime_order(reordered.graph)]


def profiled_order(model: onnx.ModelProto, tmp: Path | None = None) -> list[str]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_profiling = True
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, random_inputs(session, seed=0))
    path = session.end_profiling()
    try:
        events = json.loads(Path(path).read_text())
    finally:
        os.remove(path)
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return [e["name"].removesuffix("_kernel_time") for e in sorted(kernels, key=lambda e: e["ts"])]


def test_measured_peak_drops():
    """Tens of MiB: the small branch's 8 MiB no longer waits beside the big branch's 32 MiB."""
    model = two_branches(channels=8, size=256, wide=128, out=32, big_first=True)
    result = scheduled(model, "onnxruntime")
    assert result is not None
    before, after = measure_peak(model), measure_peak(result.model)
    if before.peak_bytes is None:
        pytest.skip(before.reason)
    assert after.peak_bytes < before.peak_bytes - 4 * 1024 * 1024
