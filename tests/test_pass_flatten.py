"""eliminate-flatten: Flatten(axis=1) of a rank-2 tensor in front of Gemm is removed."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts, signature

PASSES = ("eliminate-flatten",)


def flatten_gemm(x_shape=("batch", 4), *, k=4, bias=True, trans_a=0, opset=13, **flatten_attrs):
    """Abs(x) -> Flatten named "flat" -> Gemm(W[k, 5], bias?) named "gemm" -> y."""
    b = GraphBuilder(opset=opset)
    f = b.op("Flatten", b.op("Abs", b.input("x", list(x_shape))), name="flat", **flatten_attrs)
    args = [b.const(b.rand(k, 5))] + ([b.const(b.rand(5))] if bias else [])
    return b.build(b.op("Gemm", f, *args, name="gemm", transA=trans_a), output_names=["y"])


@pytest.mark.parametrize("kw", [
    {}, {"axis": 1}, {"axis": -1}, {"bias": False}, {"x_shape": (3, 4)}, {"opset": 9},
    {"x_shape": (4, "batch"), "trans_a": 1}, {"x_shape": (1, 4), "axis": 0}, {"x_shape": (1, 4), "axis": -2},
], ids=["default-axis", "axis-1", "axis-minus-1", "no-bias", "static", "opset-9", "transA", "axis-0-of-1xC",
        "axis-minus-2-of-1xC"])
def test_removed(tmp_path, kw):
    model = flatten_gemm(**kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Abs": 1, "Gemm": 1}
    assert [o.name for o in result.model.graph.output] == ["y"]
    for dims in ({"batch": 1}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)  # the same Gemm on the same data
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


def test_flattening_a_feature_map_is_not_this_pattern(tmp_path):
    """Flatten of [N, C, 1, 1] before a classifier changes the rank: nothing fuses, nothing reported."""
    model = flatten_gemm(("batch", 4, 1, 1))
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions and not result.report.near_misses
    assert op_counts(result.model) == op_counts(model)


def _flatten_read_elsewhere():
    b = GraphBuilder()
    f = b.op("Flatten", b.input("x", ["batch", 4]), name="flat")
    y = b.op("Gemm", f, b.const(b.rand(4, 5)), name="gemm")
    return b.build(y, b.op("Relu", f, name="reader"), output_names=["y", "z"])


@pytest.mark.parametrize("build, reason", [
    (lambda: flatten_gemm((2, 2), axis=0), "flat with axis=0 changes the shape [2, 2]"),
    (lambda: flatten_gemm(("batch", 4), k=1, axis=2), "flat with axis=2 changes the shape ['batch', 4]"),
    (_flatten_read_elsewhere, "flat's output 'flat_out' is also read by reader"),
], ids=["axis-0", "axis-2", "read-elsewhere"])
def test_kept(tmp_path, build, reason):
    model = build()
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "eliminate-flatten"]
    assert reason in miss


def _flattened(shape, axis):
    axis += len(shape) if axis < 0 else 0
    return [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))]


@pytest.mark.parametrize("shape", [(1, 5), (5, 1), (3, 4)], ids=["1x5", "5x1", "3x4"])
@pytest.mark.parametrize("axis", [-2, -1, 0, 1, 2])
def test_every_axis_removes_the_flatten_exactly_when_it_keeps_the_shape(tmp_path, shape, axis):
    """Flatten(axis) of a rank-2 tensor is [prod(dims[:axis]), prod(dims[axis:])]: a no-op only
    where that is the tensor's own shape (axis 1 always; axis 0 for [1, C]; axis 2 for [N, 1])."""
    model = flatten_gemm(shape, k=_flattened(shape, axis)[1], axis=axis)
    result = optimize_model(model, tmp_path, passes=PASSES)
    no_op = _flattened(shape, axis) == list(shape)
    assert ("Flatten" not in op_counts(result.model)) == no_op
    if not no_op:
        assert_declined(model, result, "eliminate-flatten", "changes the shape")
    assert_equivalent(model, result.model, rtol=0.0, atol=0.0)
