"""Quantized models: QDQ boundaries and QOperator nodes stay as they are; the rest still fuses."""

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from fuse_cli.targets import emit_reason
from tests.conftest import assert_equivalent, optimize_model, saved_by_onnxruntime
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
    one, zero_u8 = b.const(np.float32(0.02)), b.const(np.uint8(128), dtype=np.uint8)
    zero_i8 = b.const(np.int8(0), dtype=np.int8)
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
    assert after["QuantizeLinear"] == before["QuantizeLinear"]
    assert after["DequantizeLinear"] == before["DequantizeLinear"]
    readers = {}
    for node in result.model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    dq_of_x = [n for n in result.model.graph.node if n.op_type == "DequantizeLinear"
               and readers.get(n.output[0]) == ["Add"]]
    assert len(dq_of_x) == 4 and all(len(readers[n.output[0]]) == 1 for n in dq_of_x)
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_a_softmax_unit_stays_in_float_at_ort_cpu(tmp_path):
    """onnxruntime's CPU QLinearSoftmax ran 2.0-2.6x the DequantizeLinear -> Softmax ->
    QuantizeLinear it would replace (ops/qlinear_unary.py): no pass forms it; the unit stays whole
    for onnxruntime, and the target table says why."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 4, 16, 16])
    scale, zero = b.const(np.float32(0.03)), b.const(np.uint8(120), dtype=np.uint8)
    scores = b.op("DequantizeLinear", b.op("QuantizeLinear", x, scale, zero), scale, zero)
    out_scale, out_zero = b.const(np.float32(1 / 255)), b.const(np.uint8(0), dtype=np.uint8)
    q = b.op("QuantizeLinear", b.op("Softmax", scores, axis=-1), out_scale, out_zero)
    model = b.build(b.op("DequantizeLinear", q, out_scale, out_zero), output_names=["y"])
    result = optimize_model(model, tmp_path, target="ort-cpu")
    assert op_counts(result.model) == op_counts(model)
    assert "measured 2.0-2.6x slower" in emit_reason("ort-cpu", "QLinearSoftmax", "float32")
    assert_equivalent(model, result.model, dims={"batch": 2})
    assert_equivalent(model, result.model, dims={"batch": 3}, seeds=(2,))


# ---- models onnxruntime.quantization makes: fuse's output must give onnxruntime the same kernels

# onnxruntime's quantized kernels, and the Q/DQ its optimizer leaves where it has none
FORMED_OPS = ("QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QGemm",
              "QAttention", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "ConvInteger",
              "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear")


def float_cnn():
    """Conv -> BatchNormalization -> Relu, a residual Conv + Add, pooling and a Gemm head."""
    b = GraphBuilder(opset=17, seed=3)
    x = b.input("x", ["batch", 3, 8, 8])
    conv = b.op("Conv", x, b.const(b.rand(8, 3, 3, 3)), b.const(b.rand(8)), pads=[1, 1, 1, 1])
    bn = b.op("BatchNormalization", conv, b.const(b.rand(8, low=0.5, high=1.5)), b.const(b.rand(8)),
              b.const(b.rand(8)), b.const(b.rand(8, low=0.5, high=2.0)))
    relu = b.op("Relu", bn)
    residual = b.op("Add", b.op("Conv", relu, b.const(b.rand(8, 8, 3, 3)), pads=[1, 1, 1, 1]), relu)
    flat = b.op("Flatten", b.op("GlobalAveragePool", residual))
    return b.build(b.op("Gemm", flat, b.const(b.rand(8, 5)), b.const(b.rand(5))), output_names=["y"])


def float_mlp():
    b = GraphBuilder(opset=17, seed=4)
    h = b.op("Relu", b.op("Add", b.op("MatMul", b.input("x", ["batch", 16]), b.const(b.rand(16, 32))),
                          b.const(b.rand(32))))
    return b.build(b.op("Add", b.op("MatMul", h, b.const(b.rand(32, 8))), b.const(b.rand(8))), output_names=["y"])


def quantized(model, tmp_path, form: str, *, per_channel: bool = True, pre_optimize: bool = True):
    """`model` through onnxruntime.quantization as its documentation says: quant_pre_process, then
    quantize_static (QDQ, calibrated on seeded random inputs) or quantize_dynamic."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    float_path, prepared, out = tmp_path / "float.onnx", tmp_path / "prepared.onnx", tmp_path / f"{form}.onnx"
    onnx.save(model, float_path)
    quant_pre_process(str(float_path), str(prepared), skip_optimization=not pre_optimize)

    class Batches(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self._batches = iter([{"x": rng.standard_normal((2, *shape)).astype(np.float32)} for _ in range(3)])

        def get_next(self):
            return next(self._batches, None)

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    if form == "dynamic":
        quantize_dynamic(str(prepared), str(out), weight_type=QuantType.QInt8)
    else:
        quantize_static(str(prepared), str(out), Batches(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return onnx.load(out)


def formed_offline(model, tmp_path) -> Counter:
    """The quantized kernels onnxruntime forms from `model` at ORT_ENABLE_EXTENDED (CPU), read back
    from the model its offline optimizer saves."""
    kinds = Counter(n.op_type for n in saved_by_onnxruntime(model, tmp_path, "extended").graph.node)
    return Counter({op: kinds[op] for op in FORMED_OPS if kinds[op]})


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("builder,form,per_channel,kernel", [
    (float_cnn, "qdq", True, "QLinearConv"),
    (float_cnn, "qdq", False, "QLinearConv"),
    (float_mlp, "qdq", True, "QGemm"),
    (float_cnn, "dynamic", False, "ConvInteger"),
    (float_mlp, "dynamic", False, "DynamicQuantizeMatMul"),
])
def test_onnxruntime_forms_the_same_kernels_from_fuses_output(tmp_path, target, builder, form, per_channel, kernel):
    model = quantized(builder(), tmp_path, form, per_channel=per_channel)
    result = optimize_model(model, tmp_path, target=target)
    before, after = formed_offline(model, tmp_path), formed_offline(result.model, tmp_path)
    assert before[kernel] > 0, before  # the quantizer made what this test is about
    assert after == before
    assert_equivalent(model, result.model, dims={"batch": 2})
    assert_equivalent(model, result.model, dims={"batch": 3}, seeds=(2,))


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_a_batchnorm_between_qdq_pairs_says_why_it_stays(tmp_path, target):
    """Quantized without the pre-processing's optimizer, the BatchNormalization keeps Q/DQ pairs on
    both sides and DequantizeLinear-of-int8 parameters: it stays, with a reason of its own."""
    model = quantized(float_cnn(), tmp_path, "qdq", pre_optimize=False)
    assert op_counts(model)["BatchNormalization"] == 1
    result = optimize_model(model, tmp_path, target=target)
    assert op_counts(result.model)["BatchNormalization"] == 1
    (miss,) = [m for m in result.report.near_misses if m.pass_name == "bn-affine"]
    assert "inside a QDQ node unit" in miss.reason and "goes to QuantizeLinear" in miss.reason
    assert "quant_pre_process" in miss.reason
    assert formed_offline(result.model, tmp_path) == formed_offline(model, tmp_path)
    assert_equivalent(model, result.model, dims={"batch": 2})


def qdq_unit_with_activation(op: str):
    """DQ(x), DQ(int8 W), DQ(int32 bias) -> Conv | Gemm | MatMul -> Relu (MatMul: * scalar) -> Q -> DQ:
    one QDQ node unit that onnxruntime turns into QLinearConv / QGemm / QLinearMatMul."""
    b = GraphBuilder(opset=17, seed=5)
    scale, zero = b.const(np.float32(0.05)), b.const(np.uint8(128), dtype=np.uint8)
    shape = {"Conv": ["batch", 3, 8, 8], "Gemm": ["batch", 12], "MatMul": ["batch", 6, 12]}[op]
    x = b.op("DequantizeLinear", b.op("QuantizeLinear", b.input("x", shape), scale, zero), scale, zero)
    w_shape = {"Conv": (4, 3, 3, 3), "Gemm": (12, 4), "MatMul": (12, 4)}[op]
    w = b.op("DequantizeLinear", b.const(b.rng.integers(-60, 60, w_shape).astype(np.int8)), b.const(np.float32(0.01)),
             b.const(np.int8(0), dtype=np.int8))

    def bias():
        return b.op("DequantizeLinear", b.const(b.rng.integers(-100, 100, (4,)).astype(np.int32)),
                    b.const(np.float32(0.0005)), b.const(np.int32(0), dtype=np.int32))

    if op == "Conv":
        y = b.op("Relu", b.op("Conv", x, w, bias(), pads=[1, 1, 1, 1], name="unit"))
    elif op == "Gemm":
        y = b.op("Relu", b.op("Gemm", x, w, bias(), name="unit"))
    else:
        y = b.op("Mul", b.op("MatMul", x, w, name="unit"), b.const(np.float32(0.5)))
    out_scale, out_zero = b.const(np.float32(0.04)), b.const(np.uint8(0), dtype=np.uint8)
    q = b.op("QuantizeLinear", y, out_scale, out_zero)
    return b.build(b.op("DequantizeLinear", q, out_scale, out_zero), output_names=["y"])


@pytest.mark.parametrize("op,pass_name", [("Conv", "fused-conv"), ("Gemm", "fused-gemm"), ("MatMul", "fused-matmul")])
def test_a_qdq_unit_is_not_fused_into_a_float_operator(tmp_path, op, pass_name):
    """At ort-cpu, fused-conv made FusedConv of DQ -> Conv -> Relu -> Q, and onnxruntime then formed
    no QLinearConv: the convolution ran in float. The unit is not the float pass's; it says why.
    (qlinear-conv and qgemm, which form the Conv and Gemm units themselves, are left out here.)"""
    model = qdq_unit_with_activation(op)
    result = optimize_model(model, tmp_path, target="ort-cpu", disable=("qlinear-conv", "qgemm"))
    assert not [f for f in result.report.fusions if f.pass_name == pass_name]
    (miss,) = [m for m in result.report.near_misses if m.pass_name == pass_name]
    assert miss.reason.startswith("unit is inside a QDQ node unit") and "DequantizeLinear" in miss.reason
    assert formed_offline(result.model, tmp_path) == formed_offline(model, tmp_path)
    assert_equivalent(model, result.model, dims={"batch": 2})
    assert_equivalent(model, result.model, dims={"batch": 3}, seeds=(2,))


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_the_conv_unit_is_formed_into_qlinearconv_before_any_float_fusion(tmp_path, target):
    """The whole pipeline: qlinear-conv forms the QLinearConv onnxruntime would (the Relu, made
    redundant by the output's zero point 0, dropped with it), so fused-conv never sees the Conv."""
    model = qdq_unit_with_activation("Conv")
    result = optimize_model(model, tmp_path, target=target)
    counts = op_counts(result.model)
    assert counts["QLinearConv"] == 1 and "Conv" not in counts and "Relu" not in counts, counts
    assert formed_offline(result.model, tmp_path) == formed_offline(model, tmp_path)
    assert_equivalent(model, result.model, dims={"batch": 2})
    assert_equivalent(model, result.model, dims={"batch": 3}, seeds=(2,))
