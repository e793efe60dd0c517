"""Quantized models: QDQ boundaries and QOperator nodes stay as they are; the rest still fuses."""

import numpy as np
from onnx import TensorProto

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts


def qdq_conv_bn_model():
    """x -> Q -> DQ -> Conv(W = DQ(int8 weight)) -> BN -> Relu -> Q -> DQ, as quantizers write it."""
    b = GraphBuilder(opset=17)
    scale, zero = b.const(np.float32(0.05)), b.const(np.int8(0), dtype=np.int8)
    x = b.op("DequantizeLinear", b.op("QuantizeLinear", b.input("x", ["batch", 3, 8, 8]), scale, zero), scale, zero)
    w_int8 = b.const(b.rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8))
    w = b.op("DequantizeLinear", w_int8, b.const(np.float32(0.01)), b.const(np.int8(0), dtype=np.int8))
    c = b.op("Conv", x, w, pads=[1, 1, 1, 1], name="conv")
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)), b.const(b.rand(4)),
             b.const(b.rand(4, low=0.5, high=2.0)), name="bn")
    q = b.op("QuantizeLinear", b.op("Relu", y), b.const(np.float32(0.05)), b.const(np.uint8(0), dtype=np.uint8))
    return b.build(b.op("DequantizeLinear", q, b.const(np.float32(0.05)), b.const(np.uint8(0), dtype=np.uint8)),
                   output_names=["y"])


def test_qdq_boundaries_are_kept_and_outputs_match(tmp_path):
    model = qdq_conv_bn_model()
    result = optimize_model(model, tmp_path)
    counts = op_counts(result.model)
    assert counts["QuantizeLinear"] == 2 and counts["DequantizeLinear"] == 3, counts  # none folded away
    (miss,) = [m for m in result.report.near_misses if m.pass_name == "conv-bn"]
    assert "computed at run time by" in miss.reason and "DequantizeLinear" in miss.reason
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_qoperator_nodes_are_left_untouched(tmp_path):
    b = GraphBuilder(opset=13)
    x = b.input("x", ["batch", 3, 8, 8], TensorProto.UINT8)
    one, zero_u8, zero_i8 = b.const(np.float32(0.02)), b.const(np.uint8(128), dtype=np.uint8), b.const(np.int8(0), dtype=np.int8)
    weight = b.const(b.rng.integers(-50, 50, (4, 3, 3, 3)).astype(np.int8))
    conv = b.op("QLinearConv", x, one, zero_u8, weight, b.const(np.float32(0.01)), zero_i8, one, zero_u8,
                pads=[1, 1, 1, 1], name="qconv")
    deq = b.op("DequantizeLinear", conv, one, zero_u8)
    model = b.build(b.op("Identity", b.op("Relu", deq)), output_names=["y"])
    result = optimize_model(model, tmp_path)
    counts = op_counts(result.model)
    assert counts["QLinearConv"] == 1 and counts["DequantizeLinear"] == 1 and "Identity" not in counts
    assert_equivalent(model, result.model, dims={"batch": 2})


def qdq_residual_adds_model():
    """x quantized once per consumer, as onnxruntime's quantizer writes QDQ: two Adds, each reading
    its own identical Q -> DQ pair of x (and of the weights it adds)."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 16])
    scale, zero = b.const(np.float32(0.02)), b.const(np.uint8(128), dtype=np.uint8)

    def qdq(t):
        return b.op("DequantizeLinear", b.op("QuantizeLinear", t, scale, zero), scale, zero)

    outs = [b.op("Add", qdq(x), qdq(b.const(b.rand(16)))) for _ in range(2)]
    return b.build(qdq(outs[0]), qdq(outs[1]), output_names=["y0", "y1"])


def test_a_qdq_unit_stays_its_consumers_own(tmp_path):
    """Common-subexpression elimination would merge the two identical Q -> DQ pairs of x into one
    pair read by both Adds: onnxruntime then forms fewer QLinearAdd. Each pair stays."""
    model = qdq_residual_adds_model()
    result = optimize_model(model, tmp_path)
    before, after = op_counts(model), op_counts(result.model)
    assert after["QuantizeLinear"] == before["QuantizeLinear"] and after["DequantizeLinear"] == before["DequantizeLinear"]
    readers = {}
    for node in result.model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    dq_of_x = [n for n in result.model.graph.node if n.op_type == "DequantizeLinear"
               and readers.get(n.output[0]) == ["Add"]]
    assert len(dq_of_x) == 4 and all(len(readers[n.output[0]]) == 1 for n in dq_of_x)
    assert_equivalent(model, result.model, dims={"batch": 2})
