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
