"""fuse-casts: exact Cast chains merge into one Cast, Casts to the input's own type go."""

from __future__ import annotations

import pytest
from onnx import TensorProto as T

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("fuse-casts",)


def casts(a, *targets, opset=17, x_shape=("batch", 3)):
    """x:a -> Identity -> Cast(to=t) for each target (named c0, c1, ...) -> y."""
    b = GraphBuilder(opset=opset)
    t = b.op("Identity", b.input("x", list(x_shape), dtype=a))
    for i, to in enumerate(targets):
        t = b.op("Cast", t, name=f"c{i}", to=to)
    return b.build(t, output_names=["y"])


def cast_targets(model):
    return [next(a.i for a in n.attribute if a.name == "to") for n in model.graph.node if n.op_type == "Cast"]


@pytest.mark.parametrize("a, targets, remaining", [
    (T.FLOAT16, [T.FLOAT, T.DOUBLE], [T.DOUBLE]),
    (T.INT8, [T.INT32, T.INT64], [T.INT64]),
    (T.UINT8, [T.FLOAT16, T.FLOAT], [T.FLOAT]),
    (T.UINT8, [T.INT16, T.INT8], [T.INT8]),
    (T.INT8, [T.FLOAT, T.INT32], [T.INT32]),
    (T.BOOL, [T.INT32, T.FLOAT], [T.FLOAT]),
    (T.INT16, [T.FLOAT, T.FLOAT16], [T.FLOAT16]),
    (T.FLOAT16, [T.FLOAT, T.DOUBLE, T.FLOAT], [T.FLOAT]),
    (T.FLOAT16, [T.FLOAT, T.FLOAT16], []),
    (T.FLOAT, [T.DOUBLE, T.FLOAT], []),
    (T.FLOAT, [T.FLOAT], []),
    (T.INT64, [T.INT64, T.FLOAT], [T.FLOAT]),
], ids=["f16-f32-f64", "i8-i32-i64", "u8-f16-f32", "u8-i16-i8", "i8-f32-i32", "bool-i32-f32", "i16-f32-f16",
        "f16-f32-f64-f32", "f16-f32-f16", "f32-f64-f32", "f32-f32", "i64-i64-f32"])
def test_merged(tmp_path, a, targets, remaining):
    model = casts(a, *targets)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert cast_targets(result.model) == remaining
    assert op_counts(result.model) == {"Identity": 1} | ({"Cast": 1} if remaining else {})
    for dims in ({"batch": 1}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)  # exact: bit-identical
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


@pytest.mark.parametrize("a, targets, reason", [
    (T.FLOAT, [T.FLOAT16, T.FLOAT], "c0 casts float to float16, which loses values: c1 cannot skip it"),
    (T.FLOAT, [T.INT32, T.FLOAT], "c0 casts float to int32, which loses values"),
    (T.INT32, [T.FLOAT, T.INT64], "c0 casts int32 to float, which loses values"),
    (T.INT64, [T.INT32, T.INT64], "c0 casts int64 to int32, which loses values"),
    (T.FLOAT16, [T.BFLOAT16, T.FLOAT], "c0 casts float16 to bfloat16, which loses values"),
    (T.INT16, [T.FLOAT, T.INT8], "int16 -> int8 wraps out-of-range values but float -> int8 does not"),
], ids=["f32-f16-f32", "f32-i32-f32", "i32-f32-i64", "i64-i32-i64", "f16-bf16-f32", "i16-f32-i8"])
def test_kept(tmp_path, a, targets, reason):
    model = casts(a, *targets)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions
    assert signature(result.model) == signature(model)
    last = f"c{len(targets) - 1}"
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "fuse-casts" and m.nodes[-1] == last]
    assert reason in miss


def test_a_converting_cast_is_not_a_near_miss(tmp_path):
    """A lone Cast that changes the type is simply not this pattern: no fusion, no noise."""
    model = casts(T.FLOAT, T.DOUBLE)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions and not result.report.near_misses
    assert signature(result.model) == signature(model)


def test_same_type_cast_from_input_to_output_is_kept(tmp_path):
    b = GraphBuilder()
    model = b.build(b.op("Cast", b.input("x", [2, 3]), to=T.FLOAT, name="c0"), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "fuse-casts"]
    assert "'y' is a graph output fed directly by 'x', which is a graph input" in miss


def test_needs_opset_6(tmp_path):
    b = GraphBuilder(opset=5)
    c = b.op("Cast", b.op("Cast", b.input("x", [2, 3], dtype=T.FLOAT16), to="FLOAT", name="c0"), to="DOUBLE", name="c1")
    model = b.build(c, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "fuse-casts" and m.nodes[-1] == "c1"]
    assert "needs opset 6, the model has opset 5: pass --upgrade-opset 6" in miss
