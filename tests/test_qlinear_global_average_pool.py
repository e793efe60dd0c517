"""qlinear-global-average-pool: a QDQ GlobalAveragePool node unit becomes com.microsoft
QLinearGlobalAveragePool at the onnxruntime targets, as onnxruntime forms it at ORT_ENABLE_EXTENDED;
within one step of the unit's float computation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import assert_declined, op_counts
from tests.test_qlinear import QMIN, QdqUnit, within_one_step
from tests.test_quantized import float_cnn, formed_offline, quantized

PASS = "qlinear-global-average-pool"
FORMED = "com.microsoft::QLinearGlobalAveragePool"


def pool_unit(*, dtype=np.uint8, out_dtype=None, spatial=("height", 5), relu=False, per_axis_input=False,
              pool_read_twice=False, scale_input=False, seed=0) -> onnx.ModelProto:
    """Features [batch, 6, *spatial] quantized over their calibrated range, GlobalAveragePool, Q
    over the means' range (from qmin where a Relu precedes it)."""
    u = QdqUnit(seed, activation=dtype)
    x = u.b.input("x", ["batch", 6, *spatial])
    if per_axis_input:
        scale, zero = u.b.const(np.linspace(0.02, 0.04, 6, dtype=np.float32)), u.b.const(np.full(6, QMIN[dtype] + 128,
                                                                                             dtype))
        features = u.b.op("DequantizeLinear", u.b.op("QuantizeLinear", x, scale, zero, axis=1), scale, zero, axis=1)
    else:
        features, _ = u.qdq(x, -2.7, 3.1)
    pooled = u.b.op("GlobalAveragePool", features, name="pool")
    outputs = []
    if scale_input:
        scale = u.b.input("y_scale", [], TensorProto.FLOAT)
        zero = u.b.const(dtype(QMIN[dtype] + 128), dtype=dtype)
        outputs.append(u.b.op("DequantizeLinear", u.b.op("QuantizeLinear", pooled, scale, zero), scale, zero))
    elif out_dtype is not None:
        outputs.append(u.qdq(pooled, -0.9, 1.1, dtype=out_dtype)[0])
    else:
        outputs.append(u.output(pooled, -0.9, 1.1, relu=relu))
    if pool_read_twice:
        outputs.append(u.b.op("Sigmoid", pooled))
    return u.b.build(*outputs, output_names=["y", "second"][: len(outputs)])


def test_the_cnn_head_becomes_what_onnxruntime_forms(tmp_path):
    model = quantized(float_cnn(), tmp_path, "qdq")
    result = optimize_model(model, tmp_path, target="ort-cpu")
    assert op_counts(result.model)[FORMED] == formed_offline(model, tmp_path)["QLinearGlobalAveragePool"] == 1
    assert formed_offline(result.model, tmp_path) == formed_offline(model, tmp_path)  # nothing it forms is lost
    assert_equivalent(model, result.model, dims={"batch": 2})
    assert_equivalent(model, result.model, dims={"batch": 5}, seeds=(3,))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("spatial", [("height", 5), ("height",), ("depth", 3, 4)], ids=["2-D", "1-D", "3-D"])
@pytest.mark.parametrize("relu", [False, True], ids=["plain", "relu"])
def test_a_pool_unit_becomes_qlinearglobalaveragepool(tmp_path, dtype, spatial, relu):
    """Images of every rank; a Relu the Q's zero point (qmin) makes redundant goes with the unit."""
    model = pool_unit(dtype=dtype, spatial=spatial, relu=relu, seed=len(spatial))
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,))
    counts = op_counts(result.model)
    assert counts[FORMED] == 1 and "GlobalAveragePool" not in counts and "Relu" not in counts, counts
    step = (1.1 - (0.0 if relu else -0.9)) / 255  # the output's scale: its calibrated range over 255
    for index, dims in enumerate(({"batch": 2, "height": 3, "depth": 2}, {"batch": 3, "height": 11, "depth": 5})):
        within_one_step(model, result.model, dims, step, seed=index)
        assert_equivalent(model, result.model, dims=dims, seeds=(index,))


@pytest.mark.parametrize("variant,reason", [
    ({"pool_read_twice": True}, "is also read by"),
    ({"out_dtype": np.int8}, "no quantized kernel for x uint8, output int8"),
    ({"per_axis_input": True}, "the x scale has 6 values (per-axis)"),
    ({"scale_input": True}, "is a graph input, not a constant"),
])
def test_what_the_kernel_would_compute_otherwise_stays(tmp_path, variant, reason):
    model = pool_unit(**variant)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,))
    assert_declined(model, result, PASS, reason)


def test_not_at_the_portable_target(tmp_path):
    model = quantized(float_cnn(), tmp_path, "qdq")
    result = optimize_model(model, tmp_path, target="onnx")
    assert FORMED not in op_counts(result.model)
    assert PASS not in result.report.passes
