"""static-shape-dims: Gather(Shape(x), i) of static dims becomes a constant; symbolic dims stay, silently."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("static-shape-dims",)


def channel_split(index, *, shape_attrs=None, also_read=False):
    """ShuffleNet's x.size(1) // 2 feeding a Reshape: [batch, C, H, W] -> [batch, 2, C/2, H*W]."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 8, 3, "width"])
    shape = b.op("Shape", x, name="shape", **(shape_attrs or {}))
    dim = b.op("Gather", shape, b.const(np.array(index, np.int64)), name="gather", axis=0)
    half = b.op("Div", dim, b.const(np.array(2, np.int64)))
    piece = half if isinstance(index, list) else b.op("Unsqueeze", half, b.const(np.array([0], np.int64)))
    target = b.op("Concat", b.const(np.array([0, 2], np.int64)), piece, b.const(np.array([-1], np.int64)), axis=0)
    outputs = [b.op("Reshape", x, target)]
    if also_read:
        outputs.append(b.op("Gather", shape, b.const(np.array(0, np.int64)), axis=0))
    return b.build(*outputs, output_names=["y", "n"][: len(outputs)])


@pytest.mark.parametrize("index, attrs", [(1, None), (-3, None), ([1], None), (0, {"start": 1})],
                         ids=["scalar", "negative", "vector", "shape-start"])
def test_static_dim_becomes_constant(tmp_path, index, attrs):
    model = channel_split(index, shape_attrs=attrs)
    result = optimize_model(model, tmp_path, passes=PASSES)
    counts = op_counts(result.model)
    assert counts["Shape"] == 0 and counts["Gather"] == 0
    for dims in ({"batch": 2, "width": 5}, {"batch": 3, "width": 7}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


def test_shape_read_elsewhere_stays(tmp_path):
    model = channel_split(1, also_read=True)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert (op_counts(result.model)["Shape"], op_counts(result.model)["Gather"]) == (1, 1)  # batch still read
    assert_equivalent(model, result.model, dims={"batch": 3, "width": 5}, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("index", [0, 3, [1, 3]], ids=["batch", "width", "static-and-symbolic"])
def test_symbolic_dims_are_kept_silently(tmp_path, index):
    """Reading a symbolic dim is what Shape is for: no rewrite, and no near-miss either."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 8, 3, "width"])
    dims = b.op("Gather", b.op("Shape", x), b.const(np.array(index, np.int64)), axis=0)
    model = b.build(b.op("Cast", dims, to=1), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses


def test_whole_static_shape_becomes_constant(tmp_path):
    """Shape of a shape vector built at run time (torch's expand(-1) writes ConstantOfShape(Shape(s)))."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 8])
    dim = b.op("Unsqueeze", b.op("Gather", b.op("Shape", x), b.const(np.array(0, np.int64)), axis=0),
               b.const(np.array([0], np.int64)))
    s = b.op("Concat", dim, b.const(np.array([-1], np.int64)), axis=0)
    ones = b.op("ConstantOfShape", b.op("Shape", s, name="shape_of_s"),
                value=numpy_helper.from_array(np.ones(1, np.int64)))
    model = b.build(b.op("Add", s, ones), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert "shape_of_s" not in [n.name for n in result.model.graph.node]
    assert op_counts(result.model)["Shape"] == 1  # x's: its batch is symbolic
    for dims in ({"batch": 2}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)
