"""onnxruntime's execution order as the memory estimate replays it (core/order.py), where a node
runs as its ONNX function body: onnxruntime numbers the inlined nodes after every stored one, and
that index steers its reverse depth-first walk. Checked against onnxruntime's own profile of the
run and against the allocator (analysis/measure.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.analysis.walk_setup import walk_setup
from fuse_cli.core.order import runtime_indices, runtime_order_by_producers

BLOCKS, WIDTH, ROWS = 8, 512, 64


def linear_stack(activation: str) -> onnx.ModelProto:
    """BLOCKS torch-exported Linear layers without bias: y = activation(y) @ Transpose(W), each
    Transpose(W) stored right before its MatMul (TorchScript's export without constant folding).
    Each transposed weight is 1 MiB, the activations 128 KiB: the peak is how many of the
    transposed weights are held at once."""
    rng = np.random.default_rng(0)
    weights, nodes, previous = [], [], "x"
    for i in range(BLOCKS):
        weights.append(numpy_helper.from_array(rng.normal(0, 0.05, (WIDTH, WIDTH)).astype(np.float32), f"W{i}"))
        nodes += [helper.make_node(activation, [previous], [f"a{i}"], name=f"act{i}"),
                  helper.make_node("Transpose", [f"W{i}"], [f"t{i}"], name=f"transpose{i}", perm=[1, 0]),
                  helper.make_node("MatMul", [f"a{i}", f"t{i}"], [f"y{i}"], name=f"matmul{i}")]
        previous = f"y{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTH])
    y = helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "linear_stack", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def profiled_order(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The node names onnxruntime ran, in order, from its profile (graph optimizations off, one
    thread: the session analysis/measure.py measures)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.ones((ROWS, WIDTH), np.float32)})
    events = json.loads(open(session.end_profiling()).read())
    suffix = "_kernel_time"
    return [e["name"][:-len(suffix)] for e in events if e.get("cat") == "Node" and e["name"].endswith(suffix)]


def test_a_function_bodys_nodes_compare_above_every_stored_node():
    assert runtime_indices([False, False]) is None
    assert runtime_indices([False, True, False, True]) == [0, 4, 2, 5]
    # a -> c, b -> c: c's producers are visited highest index first, so b runs first; with a
    # expanded (index 3 in onnxruntime's graph), a does.
    producers = [(), (), (0, 1)]
    assert runtime_order_by_producers(producers) == [1, 0, 2]
    assert runtime_order_by_producers(producers, runtime_indices([True, False, False])) == [0, 1, 2]


@pytest.mark.parametrize("activation", ["HardSwish", "Relu"])
def test_the_replayed_order_is_onnxruntimes(activation, tmp_path):
    """HardSwish has no CPU kernel: onnxruntime runs HardSigmoid and Mul in its place, numbered
    after every stored node, so each MatMul's producers are visited HardSwish first and its
    Transpose(W) runs right before it. Relu has a kernel: every Transpose runs first (the
    highest-index producer of each MatMul), before the chain below it."""
    model = linear_stack(activation)
    setup = walk_setup(model, None, ())
    replayed = [label for label in setup.labels if not label.startswith("act") or activation == "Relu"]
    ran = [name for name in profiled_order(model, tmp_path) if name in set(replayed)]
    assert ran == replayed
    transposes_first = all(label.startswith("transpose") for label in replayed[:BLOCKS])
    assert transposes_first == (activation == "Relu")


@pytest.mark.parametrize("activation", ["HardSwish", "Relu"])
def test_the_estimate_holds_the_transposed_weights_onnxruntime_holds(activation):
    """Before the function body's indices were modelled, the HardSwish stack was estimated as if
    it held all eight transposed weights at once, like the Relu stack (timm's LeViT at batch 4:
    32.9 MB estimated, 20.3 MB allocated; after: 20.30 MB)."""
    model = linear_stack(activation)
    measured = measure_peak(model).exact_or_resident_bytes
    if measured is None:
        pytest.skip("the peak could not be measured here")
    estimate = profile_memory(model, infer_shapes(model)).peak_bytes
    held = BLOCKS if activation == "Relu" else 1
    assert held * WIDTH * WIDTH * 4 <= estimate < (held + 1) * WIDTH * WIDTH * 4
    assert 0.85 <= estimate / measured <= 1.15, (estimate, measured)
