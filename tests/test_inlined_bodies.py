"""The leaves of a function body onnxruntime's CPU provider inlines start its execution order
(analysis/inlined_bodies.py): a float16 Attention with a float32 mask has no kernel and is inlined,
and its body's unread nodes make the walk run the upstream weights' Casts late."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.analysis.walk_setup import walk_setup

WIDTH = 256


def mlp_around(kind: str) -> onnx.ModelProto:
    """x [1, 1, W] -> MatMul -> `kind` -> three MatMuls -> Identity (the graph output written by a
    node with a float16 kernel, so no inserted Cast is a leaf of its own); float16 [W, W] weights."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) * 0.05).astype(np.float16), f"W{k}")
               for k in range(1, 5)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 1, WIDTH])]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1")]
    if kind == "softmax":
        nodes.append(helper.make_node("Softmax", ["h1"], ["a"], name="softmax", axis=-1))
    else:
        mask = TensorProto.FLOAT if kind == "attention-float32-mask" else TensorProto.FLOAT16
        inputs.append(helper.make_tensor_value_info("mask", mask, [1, 1, 1, 1]))
        nodes.append(helper.make_node("Attention", ["h1", "h1", "h1", "mask"], ["a"], name="attention",
                                      q_num_heads=4, kv_num_heads=4))
    nodes += [helper.make_node("MatMul", ["a", "W2"], ["h2"], name="mm2"),
              helper.make_node("MatMul", ["h2", "W3"], ["h3"], name="mm3"),
              helper.make_node("MatMul", ["h3", "W4"], ["h4"], name="mm4"),
              helper.make_node("Identity", ["h4"], ["y"], name="out")]
    graph = helper.make_graph(nodes, kind, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT16,
                                                                                   [1, 1, WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("kind, inlined, leaves", [
    ("attention-float32-mask", True, True),   # no kernel for the mixed types: the body, with unread nodes
    ("attention-float16-mask", False, False),  # the float16 kernel runs
    ("softmax", True, False),                  # Softmax-13's body: every node read
])
def test_the_walk_starts_where_onnxruntime_does(kind, inlined, leaves):
    model = mlp_around(kind)
    graph = walk_setup(model, None, ()).graph
    assert bool(graph.inlined) == inlined and bool(graph.leaves) == leaves
    estimate = profile_memory(model, infer_shapes(model)).peak_bytes
    measured = measure_peak(model, repeats=1)
    if measured.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {measured.allocated_reason}")
    assert abs(estimate / measured.allocated_bytes - 1) < 0.05, (estimate, measured.allocated_bytes)


def test_the_leaves_free_the_weights_float32_copies():
    """With the Attention's leaves, the walk reaches the first MatMul before the later weights'
    Casts: at its peak one float32 weight copy fewer than with every weight's Cast first (measured:
    804,924 bytes allocated against 1,054,972 with the kernel)."""
    inlined, kernel = (profile_memory(m, infer_shapes(m)) for m in map(mlp_around, ("attention-float32-mask",
                                                                                    "attention-float16-mask")))
    assert kernel.peak_bytes - inlined.peak_bytes >= WIDTH * WIDTH * 4


def query_and_key_chains(first: str) -> onnx.ModelProto:
    """A float16 Attention (scale given: two leaves, CalculatedScale reading Q, AttnBiasShape reading
    K then Q) with a float32 mask over a one-token query from a wide weight and a 512-token key;
    the two chains stored in either order. onnxruntime runs the key's chain first either way, so
    the key is alive while the query's wide float32 intermediate is: the peak."""
    rng = np.random.default_rng(0)

    def weight(name, rows, cols):
        return numpy_helper.from_array((rng.standard_normal((rows, cols)) * 0.05).astype(np.float16), name)

    chains = {"q": [helper.make_node("MatMul", ["xq", "Wq1"], ["q1"], name="q_mm1"),
                    helper.make_node("MatMul", ["q1", "Wq2"], ["q"], name="q_mm2")],
              "k": [helper.make_node("MatMul", ["xk", "Wk1"], ["k1"], name="k_mm1"),
                    helper.make_node("MatMul", ["k1", "Wk2"], ["k"], name="k_mm2")]}
    nodes = [*chains[first], *chains["k" if first == "q" else "q"],
             helper.make_node("MatMul", ["xk", "Wv1"], ["v"], name="v_mm1"),
             helper.make_node("Attention", ["q", "k", "v", "mask"], ["a"], name="attention", q_num_heads=4,
                              kv_num_heads=4, scale=0.125),
             helper.make_node("Identity", ["a"], ["y"], name="out")]
    inputs = [helper.make_tensor_value_info("xq", TensorProto.FLOAT16, [1, 1, WIDTH]),
              helper.make_tensor_value_info("xk", TensorProto.FLOAT16, [1, 512, WIDTH]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, 512])]
    weights = [weight("Wq1", WIDTH, 8 * WIDTH), weight("Wq2", 8 * WIDTH, WIDTH), weight("Wk1", WIDTH, WIDTH),
               weight("Wk2", WIDTH, WIDTH), weight("Wv1", WIDTH, WIDTH)]
    graph = helper.make_graph(nodes, "chains", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 1, WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("first", ["q", "k"])
def test_the_leaves_are_walked_in_onnxruntimes_numbering_and_reading_order(first):
    """The saved graph lists the leaves in execution order (the highest-numbered first) and a leaf
    reaches its inputs in its body's order: walked otherwise, the query's chain ran first and the
    estimate was 0.739 of the allocator's peak."""
    model = query_and_key_chains(first)
    walked = [label for label in walk_setup(model, None, ()).labels if not label.startswith("Inserted")]
    assert walked[:2] == ["k_mm1", "k_mm2"]
    estimate = profile_memory(model, infer_shapes(model)).peak_bytes
    measured = measure_peak(model, repeats=1)
    if measured.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {measured.allocated_reason}")
    assert abs(estimate / measured.allocated_bytes - 1) < 0.05, (estimate, measured.allocated_bytes)
