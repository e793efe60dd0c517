"""eliminate-noop-arith: x*1, 1*x, x/1, x+0, 0+x, x-0 go when the constant does not broadcast x."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import numpy_helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("eliminate-noop-arith",)


def arith(op, value, *, constant_first=False, x_shape=("batch", 3), dtype=np.float32, as_node=False):
    """Abs(x) -> op(., constant) named "arith" -> Relu -> y."""
    b = GraphBuilder()
    elem = {np.float32: T.FLOAT, np.int64: T.INT64, np.float16: T.FLOAT16, np.bool_: T.BOOL}[dtype]
    before, after = ("Not", "Not") if dtype == np.bool_ else ("Abs", "Neg")
    t = b.op(before, b.input("x", list(x_shape), dtype=elem))
    value = np.asarray(value, dtype=dtype)
    c = b.op("Constant", value=numpy_helper.from_array(value)) if as_node else b.const(value)
    a = b.op(op, *((c, t) if constant_first else (t, c)), name="arith")
    return b.build(b.op(after, a), output_names=["y"])


@pytest.mark.parametrize("op, value, kw", [
    ("Mul", 1.0, {}),
    ("Mul", [1.0], {"constant_first": True}),
    ("Mul", [[1.0, 1.0, 1.0]], {}),
    ("Div", [1.0, 1.0, 1.0], {}),
    ("Add", np.zeros((1, 3)), {}),
    ("Add", 0.0, {"constant_first": True}),
    ("Sub", [0.0], {}),
    ("Mul", np.ones((2, 3)), {"x_shape": (2, 3)}),
    ("Add", np.zeros((3, 1)), {"x_shape": (3, 3)}),
    ("Mul", 1, {"dtype": np.int64}),
    ("Add", [0, 0, 0], {"dtype": np.int64}),
    ("Div", [1.0], {"dtype": np.float16}),
    ("Mul", [1.0], {"as_node": True}),
], ids=["x*1", "1*x", "x*ones[1,C]", "x/ones[C]", "x+zeros[1,C]", "0+x", "x-0", "x*ones-same-shape", "x+zeros[C,1]",
        "int-x*1", "int-x+zeros", "f16-x/1", "constant-node"])
def test_removed(tmp_path, op, value, kw):
    model = arith(op, value, **kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Abs": 1, "Neg": 1}  # an unread Constant node goes too
    for dims in ({"batch": 1}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)  # x*1 etc. are exact
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


@pytest.mark.parametrize("op, value, kw, reason", [
    ("Mul", np.ones((2, 1, 3)), {}, "arith's constant of shape [2, 1, 3] broadcasts 'Abs_1_out' of shape "
                                    "['batch', 3] to a higher rank"),
    ("Mul", np.ones((2, 3)), {}, "arith's constant of shape [2, 3] may broadcast 'Abs_1_out' of shape "
                                 "['batch', 3] to a larger shape"),
    ("Add", np.zeros((1, 3)), {"x_shape": ("batch", 1)},
     "may broadcast 'Abs_1_out' of shape ['batch', 1] to a larger shape"),
], ids=["higher-rank", "symbolic-dim", "row-over-column"])
def test_kept_with_reason(tmp_path, op, value, kw, reason):
    model = arith(op, value, **kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "eliminate-noop-arith"]
    assert reason in miss


@pytest.mark.parametrize("op, value", [("Sub", 0.0), ("Div", 1.0), ("Mul", 2.0), ("Add", [0.0, 1.0, 0.0]),
                                       ("Mul", 0.0), ("Add", [1.0])],
                         ids=["0-x", "1/x", "x*2", "x+mixed", "x*0", "x+1"])
def test_not_matched(tmp_path, op, value):
    model = arith(op, value, constant_first=op in ("Sub", "Div"))
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.near_misses


@pytest.mark.parametrize("op, value, kw", [
    ("And", True, {}),
    ("And", np.ones((1, 3), bool), {"constant_first": True}),  # dynamo's And(new_ones, mask)
    ("Or", [False, False, False], {}),
    ("Xor", False, {"constant_first": True}),
], ids=["x-and-true", "ones-and-x", "x-or-false", "false-xor-x"])
def test_logic_identity_removed(tmp_path, op, value, kw):
    model = arith(op, value, dtype=np.bool_, **kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Not": 2}
    for dims in ({"batch": 1}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("op, value", [("And", False), ("Or", True), ("Xor", True), ("And", [True, False, True])],
                         ids=["x-and-false", "x-or-true", "x-xor-true", "x-and-mixed"])
def test_logic_not_matched(tmp_path, op, value):
    model = arith(op, value, dtype=np.bool_)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.near_misses


def test_logic_constant_that_broadcasts_is_kept(tmp_path):
    model = arith("And", np.ones((2, 3), bool), dtype=np.bool_)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "eliminate-noop-arith"]
    assert "may broadcast" in miss


def test_input_to_output_is_kept(tmp_path):
    b = GraphBuilder()
    model = b.build(b.op("Mul", b.input("x", [2, 3]), b.const(1.0)), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "eliminate-noop-arith"]
    assert "'y' is a graph output fed directly by 'x', which is a graph input" in miss
