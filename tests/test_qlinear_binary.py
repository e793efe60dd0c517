"""qlinear-binary: a QDQ Add or Mul node unit becomes com.microsoft QLinearAdd / QLinearMul at the
onnxruntime targets, as onnxruntime forms them at ORT_ENABLE_EXTENDED; numerically the unit's
float computation within the steps verification allows a quantized output."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts
from tests.test_quantized import float_cnn, formed_offline, quantized

PASS = "qlinear-binary"


def gated_residual() -> onnx.ModelProto:
    """Two branches of x, a gate's Mul and a residual Add, weights perturbed."""
    b = GraphBuilder(opset=17, seed=11)
    x = b.input("x", ["batch", 4, 6, 6])
    left = b.op("Conv", x, b.const(b.rand(4, 4, 3, 3) * 0.5), b.const(b.rand(4)), pads=[1, 1, 1, 1])
    right = b.op("Sigmoid", b.op("Conv", x, b.const(b.rand(4, 4, 1, 1)), b.const(b.rand(4))))
    gated = b.op("Mul", left, right)
    return b.build(b.op("Add", gated, x), output_names=["y"])


@pytest.mark.parametrize("builder", [float_cnn, gated_residual], ids=["residual-add", "gate-mul-and-add"])
def test_the_units_become_what_onnxruntime_forms(tmp_path, builder):
    model = quantized(builder(), tmp_path, "qdq")
    result = optimize_model(model, tmp_path, target="ort-cpu")
    formed = op_counts(result.model)
    offline = formed_offline(model, tmp_path)
    for op in ("QLinearAdd", "QLinearMul"):
        assert formed[f"com.microsoft::{op}"] == offline[op], (formed, offline)
    assert formed["com.microsoft::QLinearAdd"] >= 1
    assert formed_offline(result.model, tmp_path) == offline  # nothing onnxruntime forms is lost
    assert_equivalent(model, result.model, dims={"batch": 2})
    assert_equivalent(model, result.model, dims={"batch": 5}, seeds=(3,))


def test_not_at_the_portable_target(tmp_path):
    model = quantized(float_cnn(), tmp_path, "qdq")
    result = optimize_model(model, tmp_path, target="onnx")
    assert not [n for n in result.model.graph.node if n.op_type.startswith("QLinear") and n.domain]
    assert PASS not in result.report.passes


def test_a_relu_before_the_quantization_stays_a_unit(tmp_path):
    """Add -> Relu -> Q: QLinearAdd has no activation; the unit stays, with the reason."""
    b = GraphBuilder(opset=17, seed=12)
    a, c = b.input("a", ["batch", 8]), b.input("c", ["batch", 8])
    u8 = np.uint8

    def dq(t: str, scale: float) -> str:
        q = b.op("QuantizeLinear", t, b.const(np.float32(scale)), b.const(u8(128), dtype=u8))
        return b.op("DequantizeLinear", q, b.const(np.float32(scale)), b.const(u8(128), dtype=u8))

    relu = b.op("Relu", b.op("Add", dq(a, 0.02), dq(c, 0.03)))
    y = b.op("DequantizeLinear", b.op("QuantizeLinear", relu, b.const(np.float32(0.04)), b.const(u8(128), dtype=u8)),
             b.const(np.float32(0.04)), b.const(u8(128), dtype=u8))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,))
    assert op_counts(result.model) == op_counts(model)
    reasons = [n.reason for n in result.report.near_misses if n.pass_name == PASS]
    assert any("has no activation" in r for r in reasons), reasons
    assert_equivalent(model, result.model, dims={"batch": 3})
