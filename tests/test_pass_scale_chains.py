"""fold-scale-chains: two constant scalings become one only where the bits are the same."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts, signature

PASSES = ("fold-scale-chains",)


def chain(inner, a, outer, b, *, dtype=np.float32, a_first=False, x_shape=("batch", 3)):
    """Abs(x) -> inner(., a) -> outer(., b) -> Neg -> y, x of shape [batch, 3]."""
    b_ = GraphBuilder()
    elem = {np.float32: T.FLOAT, np.float16: T.FLOAT16, np.int64: T.INT64}[dtype]
    t = b_.op("Abs", b_.input("x", list(x_shape), dtype=elem))
    ca, cb = b_.const(np.asarray(a, dtype)), b_.const(np.asarray(b, dtype))
    t = b_.op(inner, *((ca, t) if a_first else (t, ca)), name="inner")
    return b_.build(b_.op("Neg", b_.op(outer, t, cb, name="outer")), output_names=["y"])


@pytest.mark.parametrize("inner, a, outer, b, kw", [
    ("Div", 2.7725887, "Mul", 8.0, {}),                 # T5's x / log(16) * 8
    ("Mul", [0.3, 3.0, 7.1], "Mul", 2.0, {}),
    ("Mul", 0.25, "Mul", [1.3, 3.0, 7.1], {"a_first": True}),
    ("Div", 4.0, "Mul", 3.0, {}),
    ("Mul", 0.7, "Div", 0.25, {}),
    ("Mul", 2.0, "Div", 0.75, {}),
    ("Div", 5.0, "Div", [0.5, 0.25, 0.125], {}),
    ("Div", 3.0, "Mul", 2.0, {"dtype": np.float16}),
    ("Mul", 64, "Mul", 14, {"dtype": np.int64}),         # MobileViT's shape arithmetic
    ("Mul", -3, "Mul", [5, 7, 9], {"dtype": np.int64}),
    ("Mul", 64, "Mul", 14, {"dtype": np.int64, "x_shape": ()}),  # a scalar stays a scalar
    ("Div", 3.0, "Mul", 2.0, {"x_shape": ()}),
], ids=["t5-div-mul", "mul-mul-two", "pow2-inner", "div4-mul3", "mul-div-quarter", "mul2-div", "div-div", "f16",
        "int-mul", "int-vector", "int-scalar", "float-scalar"])
def test_folds_bit_exact(tmp_path, inner, a, outer, b, kw):
    model = chain(inner, a, outer, b, **kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    counts = op_counts(result.model)
    assert counts["Mul"] + counts["Div"] == 1
    folded = {t.name: t for t in result.model.graph.initializer}
    (scaling,) = [n for n in result.model.graph.node if n.op_type in ("Mul", "Div")]
    assert list(folded[scaling.input[1]].dims) == list(np.broadcast_shapes(np.shape(a), np.shape(b)))
    for dims in ({"batch": 2}, {"batch": 7}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("inner, a, outer, b", [("Mul", 3.0e38, "Mul", 0.5), ("Mul", 0.7, "Div", 4.0),
                                                ("Div", 5.0, "Div", [0.5, 2.0, 0.125])])
def test_an_outer_scaling_down_is_declined(tmp_path, inner, a, outer, b):
    """x * 3e38 * 0.5 at x = 2 is inf; x * 1.5e38 would be 3e38: a scaling down is never folded."""
    model = chain(inner, a, outer, b)
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), "fold-scale-chains",
                    "outer scales down: where inner's result overflows to inf, one scaling would give a finite value")


def test_rounding_twice_is_a_near_miss(tmp_path):
    model = chain("Mul", 0.3, "Mul", 3.0)
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), "fold-scale-chains",
                    "neither inner's nor outer's constant is a power of two")


@pytest.mark.parametrize("inner, outer", [("Div", "Mul"), ("Mul", "Div"), ("Div", "Div")])
def test_integer_division_is_not_the_pattern(tmp_path, inner, outer):
    """(x / 4) * 2 truncates: not x / 2, so no rewrite and (a different operation) no near-miss."""
    model = chain(inner, 4, outer, 2, dtype=np.int64)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.near_misses


def test_power_of_two_that_overflows_the_fold_is_declined(tmp_path):
    model = chain("Mul", 3.0e38, "Mul", 2.0)  # 6e38 is not a float32
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), "fold-scale-chains",
                    "folding inner's and outer's constants leaves the float32 range")
