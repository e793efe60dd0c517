"""eliminate-common-subexpressions: equal nodes merge, whole duplicated chains at once; random
operators, different attributes and different constants do not."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("eliminate-common-subexpressions",)


def shape_chains(*, second_index: int = 0, second_axes=(0,)) -> GraphBuilder:
    """What the TorchScript exporter writes per use of x.size(0): Shape -> Gather -> Unsqueeze,
    twice, each with its own index and axes constants; the two results are concatenated into a
    Reshape shape."""
    b = GraphBuilder(opset=13)
    x = b.input("x", ["batch", "sequence", 4])
    pieces = []
    for index, axes in ((0, (0,)), (second_index, second_axes)):
        dim = b.op("Gather", b.op("Shape", x), b.const(np.array(index, np.int64)), axis=0)
        pieces.append(b.op("Unsqueeze", dim, b.const(np.array(axes, np.int64))))
    shape = b.op("Concat", *pieces, b.const(np.array([-1], np.int64)), axis=0)
    b.output = b.op("Reshape", x, shape, name="reshape")
    return b


def test_duplicated_chain_collapses(tmp_path):
    b = shape_chains()
    model = b.build(b.output, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Shape": 1, "Gather": 1, "Unsqueeze": 1, "Concat": 1, "Reshape": 1}
    (concat,) = [n for n in result.model.graph.node if n.op_type == "Concat"]
    assert concat.input[0] == concat.input[1]
    for dims in ({"batch": 2, "sequence": 3}, {"batch": 4, "sequence": 5}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


def test_duplicate_graph_output_keeps_its_name(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["batch", 3])
    model = b.build(b.op("Relu", x), b.op("Relu", x), b.op("Neg", x), output_names=["a", "b", "c"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert [o.name for o in result.model.graph.output] == ["a", "b", "c"]
    # the second Relu's output is a graph output and so is the first's: both stay
    assert op_counts(result.model) == {"Relu": 2, "Neg": 1}
    assert_equivalent(model, result.model, dims={"batch": 3}, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("kw, gathers, unsqueezes", [({"second_index": 1}, 2, 2), ({"second_axes": (-1,)}, 1, 2)],
                         ids=["other-index", "other-axes"])
def test_different_constants_do_not_merge(tmp_path, kw, gathers, unsqueezes):
    b = shape_chains(**kw)
    model = b.build(b.output, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    counts = op_counts(result.model)  # the Shape nodes are equal; a node reading another constant is not
    assert (counts["Shape"], counts["Gather"], counts["Unsqueeze"]) == (1, gathers, unsqueezes)
    assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 3}, rtol=0.0, atol=0.0)


def test_random_and_different_attributes_are_kept(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["batch", 3])
    r1 = b.op("RandomUniformLike", x, seed=1.0)
    r2 = b.op("RandomUniformLike", x, seed=1.0)
    s1 = b.op("Softmax", x, axis=0)
    s2 = b.op("Softmax", x, axis=1)
    model = b.build(b.op("Add", b.op("Add", r1, r2), b.op("Add", s1, s2)), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions


def test_float_constants_compare_by_bits(tmp_path):
    """0.0 and -0.0 are equal numbers but not the same constant (x * -0.0 keeps signs apart)."""
    b = GraphBuilder()
    x = b.input("x", ["batch", 3])
    a = b.op("Mul", x, b.const(np.float32(0.0)))
    c = b.op("Mul", x, b.const(np.float32(-0.0)))
    model = b.build(b.op("Sub", a, c), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model)["Mul"] == 2
