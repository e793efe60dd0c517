"""bn-mul / bn-add: a per-channel constant Mul, Div or Add after a BatchNormalization folds into its
scale and bias; computed operands, other axes, training mode, c / BN and mixed dtypes do not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.conftest import fused_and_settled, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

PASSES = ("bn-mul", "bn-add")
SETTINGS = ({"batch": 1, "height": 5}, {"batch": 3, "height": 7})


def bn_then(ops: tuple[tuple[str, tuple], ...], *, const_first: bool = False, dtype=np.float32,
            training: bool = False, operand: str | None = None, reader: bool = False) -> onnx.ModelProto:
    """x [batch, 6, height, 4] -> BatchNormalization -> each (op, constant shape) in turn."""
    b = GraphBuilder()
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", ["batch", 6, "height", 4], elem)
    params = [b.rand(6, dtype=dtype), b.rand(6, dtype=dtype), b.rand(6, dtype=dtype),
              b.rand(6, low=0.5, high=1.5, dtype=dtype)]
    y = b.op("BatchNormalization", x, *(b.const(p) for p in params), name="bn",
             **({"training_mode": 1} if training else {}))
    bn_out = y
    for index, (op_type, shape) in enumerate(ops):
        k = operand or b.const(b.rand(*shape, low=0.5, high=1.5, dtype=dtype))
        y = b.op(op_type, *((k, y) if const_first else (y, k)), name=f"op{index}")
    outputs = [y] + ([b.op("Relu", bn_out, name="reader")] if reader else [])
    return b.build(*outputs, output_names=["y", "z"][:len(outputs)])


@pytest.mark.parametrize("shape", [(), (1,), (6, 1, 1), (1, 6, 1, 1)], ids=["scalar", "one", "C11", "1C11"])
@pytest.mark.parametrize("op_type", ["Mul", "Div", "Add"])
def test_channel_constant_folds_into_the_batchnorm(tmp_path, op_type, shape):
    model = bn_then(((op_type, shape),))
    result = fused_and_settled(model, tmp_path, PASSES, SETTINGS)
    assert op_counts(result.model) == {"BatchNormalization": 1}


def test_a_chain_folds_whole_with_the_constant_first(tmp_path):
    """light_inception_v2's form: BatchNormalization, Mul, Add after a Conv that two branches share."""
    model = bn_then((("Mul", (6, 1, 1)), ("Add", (6, 1, 1)), ("Mul", ())), const_first=True)
    result = fused_and_settled(model, tmp_path, PASSES, SETTINGS)
    assert op_counts(result.model) == {"BatchNormalization": 1}


def test_float16_folds(tmp_path):
    model = bn_then((("Mul", (6, 1, 1)), ("Add", (6, 1, 1))), dtype=np.float16)
    result = fused_and_settled(model, tmp_path, PASSES, SETTINGS)
    assert op_counts(result.model) == {"BatchNormalization": 1}


@pytest.mark.parametrize("pass_name, kwargs, reason", [
    ("bn-mul", {"ops": (("Mul", (1, 1, 1, 4)),)}, "does not broadcast over the channel axis alone"),
    ("bn-add", {"ops": (("Add", (6, 5, 1)),)}, "does not broadcast over the channel axis alone"),
    ("bn-mul", {"ops": (("Mul", (1, 1, 6, 1, 1)),)}, "does not broadcast over the channel axis alone"),
    ("bn-mul", {"ops": (("Mul", (6, 1, 1)),), "training": True}, "training mode"),
], ids=["last-axis", "two-axes", "grows-rank", "training"])
def test_declines_with_a_reason(tmp_path, pass_name, kwargs, reason):
    model = bn_then(**kwargs)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert_declined(model, result, pass_name, reason)


def test_not_this_pattern(tmp_path):
    """c / BN is not affine in x; a computed operand is a residual; a BN read elsewhere stays."""
    for model in (bn_then((("Div", (6, 1, 1)),), const_first=True),
                  bn_then((("Add", ()),), operand="x"),
                  bn_then((("Mul", (6, 1, 1)),), reader=True)):
        result = optimize_model(model, tmp_path, passes=PASSES)
        assert not result.report.fusions
        assert op_counts(result.model) == op_counts(model)


def test_division_by_zero_is_kept(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["batch", 2, "height", 4])
    y = b.op("BatchNormalization", x, *(b.const(np.array([1.0, 2.0], np.float32)) for _ in range(4)), name="bn")
    model = b.build(b.op("Div", y, b.const(np.array([1.0, 0.0], np.float32).reshape(2, 1, 1)), name="op0"),
                    output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert_declined(model, result, "bn-mul", "divides by a constant that holds 0")


@pytest.mark.parametrize("op_type, value, dtype", [("Mul", 2000.0, np.float16), ("Div", 5e-4, np.float16),
                                                   ("Mul", np.inf, np.float32)], ids=["fp16-mul", "fp16-div", "inf"])
def test_a_fold_out_of_range_is_declined(tmp_path, op_type, value, dtype):
    """gamma 100 over sqrt(var 1e4) keeps BN(x) near x, so BN(x) * 2000 is in float16's range, but
    gamma * 2000 is not; c = inf must give +-inf, not the NaN of inf * 0 after a fold."""
    b = GraphBuilder()
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", ["batch", 2, 3], elem)
    params = [np.array(v, dtype) for v in ([100.0, 1.0], [0.5, 0.0], [0.0, 0.0], [1e4, 1.0])]
    y = b.op("BatchNormalization", x, *(b.const(p) for p in params), name="bn")
    model = b.build(b.op(op_type, y, b.const(np.array([value, 2.0], dtype).reshape(2, 1)), name="op0"),
                    output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert_declined(model, result, "bn-mul", "is not finite")
