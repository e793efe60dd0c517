"""merge-equal-weights: initializers of equal dtype, shape and bytes become one; equal numbers of
another dtype, shape or bit pattern, graph inputs, graph outputs and weights read inside a
subgraph stay apart."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import assert_equivalent, fused_and_settled, optimize_model
from tests.graphs import GraphBuilder, op_counts

PASSES = ("merge-equal-weights",)
SETTINGS = ({"batch": 2, "sequence": 3}, {"batch": 5, "sequence": 7})


def projections(first: np.ndarray, second: np.ndarray, *, inputs: int = 2) -> GraphBuilder:
    """x @ W1 and (x or y) @ W2, added: two weights the test makes equal or not."""
    b = GraphBuilder()
    x = b.input("x", ["batch", "sequence", first.shape[0]])
    y = b.input("y", ["batch", "sequence", second.shape[0]]) if inputs == 2 else x
    b.output = b.op("Add", b.op("MatMul", x, b.const(first, name="w1")), b.op("MatMul", y, b.const(second, name="w2")))
    return b


def initializer_names(model: onnx.ModelProto) -> set[str]:
    return {t.name for t in model.graph.initializer}


@pytest.mark.parametrize("size", [4, 64], ids=["small", "over-the-sample"])
def test_equal_copies_become_one_weight(tmp_path, size):
    weight = GraphBuilder().rand(size, 8)
    b = projections(weight, weight.copy())
    model = b.build(b.output, output_names=["out"])
    result = fused_and_settled(model, tmp_path, PASSES, SETTINGS)
    assert initializer_names(result.model) == {"w1"}
    (record,) = result.report.fusions
    assert (record.pattern, record.nodes_removed) == ("Equal weights merged", 0)  # weight bytes, not nodes
    assert result.report.weight_bytes_after < result.report.weight_bytes_before
    assert [n.input[1] for n in result.model.graph.node if n.op_type == "MatMul"] == ["w1", "w1"]


def test_nodes_reading_one_weight_then_merge(tmp_path):
    """x @ W and x @ copy(W) compute the same thing once their weights are one."""
    weight = GraphBuilder().rand(8, 8)
    b = projections(weight, weight.copy(), inputs=1)
    model = b.build(b.output, output_names=["out"])
    passes = ("merge-equal-weights", "eliminate-common-subexpressions")
    result = fused_and_settled(model, tmp_path, passes, SETTINGS)
    assert op_counts(result.model) == {"MatMul": 1, "Add": 1}


def test_three_copies_and_a_distinct_weight(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["batch", 8])
    weight = b.rand(8, 8)
    other = weight.copy()
    other[3, 5] += 1.0
    out = x
    for name, value in (("a", weight), ("b", other), ("c", weight.copy()), ("d", weight.copy())):
        out = b.op("MatMul", out, b.const(value, name=name))
    model = b.build(out, output_names=["out"])
    result = fused_and_settled(model, tmp_path, PASSES, ({"batch": 3}, {"batch": 6}))
    assert initializer_names(result.model) == {"a", "b"}


def test_a_difference_outside_the_sample_keeps_weights_apart(tmp_path):
    """Equal at both ends and the middle, different elsewhere: compared in full."""
    weight = GraphBuilder().rand(64, 64)
    other = weight.copy()
    other[10, 10] = -other[10, 10] - 1.0  # byte 2600 of 16 KiB: between the sampled stretches
    b = projections(weight, other)
    model = b.build(b.output, output_names=["out"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions
    assert initializer_names(result.model) == {"w1", "w2"}


@pytest.mark.parametrize("second", [
    pytest.param(lambda w: w.view(np.int32).copy(), id="same-bytes-other-dtype"),
    pytest.param(lambda w: w.reshape(4, 2).copy(), id="same-bytes-other-shape"),
    pytest.param(lambda w: np.where(w == 0, np.float32(-0.0), w), id="zero-and-negative-zero"),
])
def test_equal_bytes_are_not_enough(tmp_path, second):
    b = GraphBuilder()
    x = b.input("x", ["batch", 8])
    weight = np.zeros(8, np.float32)
    out = b.op("Add", x, b.const(weight, name="a"))
    out = b.op("Concat", b.op("Cast", out, to=TensorProto.INT32),
               b.op("Cast", b.op("Reshape", b.const(second(weight), name="b"), b.const(np.array([1, 8], np.int64))),
                    to=TensorProto.INT32), axis=0)
    model = b.build(out, output_names=["out"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions
    assert {"a", "b"} <= initializer_names(result.model)


def test_graph_inputs_with_defaults_stay_unless_frozen(tmp_path):
    weight = GraphBuilder().rand(4, 8)
    b = projections(weight, weight.copy())
    model = b.build(b.output, output_names=["out"], initializers_as_inputs=True)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions  # a caller may feed w1 and w2 different values
    frozen = optimize_model(model, tmp_path, name="frozen", passes=PASSES, freeze_inputs=True)
    assert initializer_names(frozen.model) == {"w1"}
    for dims in SETTINGS:
        assert_equivalent(model, frozen.model, dims=dims)


def test_weights_read_inside_a_subgraph_stay(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [3])
    cond = b.input("cond", [], dtype=TensorProto.BOOL)
    outer = b.const(np.arange(3, dtype=np.float32), name="outer")
    b.const(np.arange(3, dtype=np.float32), name="inner")
    body = helper.make_graph([helper.make_node("Add", [x, "inner"], ["then_out"])], "then", [],
                             [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Neg", [x], ["else_out"])], "else", [],
                              [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [3])])
    b.nodes.append(helper.make_node("If", [cond], ["branch"], then_branch=body, else_branch=other))
    out = b.op("Add", b.op("Mul", x, outer), "branch")
    b.nodes.append(helper.make_node("Sub", ["branch", "inner"], ["diff"]))
    model = b.build(out, "diff", output_names=["out", "diff"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions
    assert initializer_names(result.model) == {"outer", "inner"}


@pytest.mark.parametrize("external", [True, False], ids=["external-data", "embedded"])
def test_big_weights_held_in_files_are_compared_from_them(tmp_path, external):
    """Weights of 64 KiB and more stay in their file (graph/weights.py): read from it, not mapped."""
    from fuse_cli import api
    from fuse_cli.config import FuseConfig

    weight = GraphBuilder().rand(128, 256)  # 128 KiB
    other = weight.copy()
    other[10, 3] += 1.0  # byte 10252 of 128 KiB: inside none of the three sampled stretches
    b = GraphBuilder()
    x = b.input("x", ["batch", 128])
    out = b.op("Add", b.op("MatMul", x, b.const(weight, name="a")), b.op("MatMul", x, b.const(weight.copy(), name="b")))
    out = b.op("Add", out, b.op("MatMul", x, b.const(other, name="c")))
    model = b.build(out, output_names=["out"])
    path = tmp_path / "big.onnx"
    # a copy: onnx.save turns the weights of the model it writes into references
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), path, save_as_external_data=external,
              all_tensors_to_one_file=True, location="big.data")
    result = api.optimize(path, FuseConfig(passes=PASSES, verify=False), tmp_path / "big.out.onnx")
    assert initializer_names(result.model) == {"a", "c"}
    for dims in ({"batch": 2}, {"batch": 5}):
        assert_equivalent(model, result.model, dims=dims)


@pytest.mark.parametrize("second, merged", [([1.0, 3.0], False), ([1.0, 2.0], True)], ids=["different", "equal"])
def test_sparse_initializers_compare_by_their_values(tmp_path, second, merged):
    """graphsurgeon reads a sparse initializer's raw_data values as zeros, which made two
    different ones look equal; the loader makes them dense first (graph/io.py)."""
    def sparse(name, values):
        return helper.make_sparse_tensor(onnx.numpy_helper.from_array(np.array(values, np.float32), name),
                                         onnx.numpy_helper.from_array(np.array([1, 4], np.int64), f"{name}_i"), [6])

    graph = helper.make_graph([helper.make_node("Add", ["x", n], [f"y{n}"]) for n in "ab"], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                              [helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, [6]) for n in "ab"],
                              sparse_initializer=[sparse("a", [1.0, 2.0]), sparse("b", second)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert bool(result.report.fusions) is merged
    assert_equivalent(model, result.model)
