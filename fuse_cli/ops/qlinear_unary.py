"""com.microsoft QLinearSoftmax and QLinearGlobalAveragePool: a QDQ unit of one input on the
quantized values. qlinear-global-average-pool emits the pool (onnxruntime targets); no pass emits
QLinearSoftmax (measured slower on the CPU): its record gives its shape and scratch where a
QOperator model holds it."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.record import MS, Contract, Input, Operator, Shapes, Slower, Spec, kernels, scalar
from fuse_cli.ops.rules import attributes, same_as_input_0

# QLinearSoftmax's `opset` from which it normalizes one axis (before: the trailing axes flattened)
SINGLE_AXIS_OPSET = 13


def _quantized_input(shape: tuple[int, ...]) -> tuple[Input, ...]:
    return (Input("X", shape, integers=(0, 256), integer_dtype="uint8"), scalar("x_scale", 1, "float32"),
            scalar("x_zero_point", 128, "uint8"))


def _softmax_transposes(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """A single-axis softmax over an axis that is not the last is transposed into a scratch copy
    of the input and computed into a second one, transposed back (onnxruntime's kernel)."""
    attrs = attributes(node)
    x = shapes.get(node.input[0])
    if int(attrs.get("opset", SINGLE_AXIS_OPSET)) < SINGLE_AXIS_OPSET or x is None or x.shape is None:
        return 0
    rank = len(x.shape)
    if int(attrs.get("axis", -1)) % max(rank, 1) == rank - 1:
        return 0
    return 2 * (shapes.nbytes(node.output[0]) or 0)


def _pooled(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """The output's shape and type: GlobalAveragePool of X dequantized, quantized by y_scale and
    y_zero_point."""
    if len(node.input) < 5 or not all(node.input[:5]):
        return []
    x, x_scale, x_zero, y_scale, y_zero = node.input[:5]
    out = node.output[0]
    return [helper.make_node("DequantizeLinear", [x, x_scale, x_zero], [f"{out}::fuse-float"]),
            helper.make_node("GlobalAveragePool", [f"{out}::fuse-float"], [f"{out}::fuse-pooled"]),
            helper.make_node("QuantizeLinear", [f"{out}::fuse-pooled", y_scale, y_zero], [out])]


RECORDS = (
    Operator(
        "QLinearSoftmax", MS,
        # The dtype is the scales' (float32, fixed by the schema), as for QLinearAdd.
        support=kernels("QLinearSoftmax", "float32", "",
                        notes="X and the output of one type, u8 or s8, per tensor; no pass emits it: measured slower "
                              "on the CPU (SLOWER); scales by floor(1/y_scale) (the quantizer's 1/255: 254); u8 "
                              "over a reduced length of 1 writes y_zero_point where 1/y_scale >= 255"),
        slower=(Slower(
            "QLinearSoftmax", "cpu",
            "onnxruntime 1.31's CPU QLinearSoftmax measured 2.0-2.6x slower than the DequantizeLinear, Softmax "
            "and QuantizeLinear it would replace (target {target})",
            "a QDQ Softmax unit as quantize_static writes it (u8, output scale 1/255), one thread, interleaved "
            "rounds, the smaller of two medians, against the same unit with QLinearSoftmax (what onnxruntime "
            "forms at ORT_ENABLE_EXTENDED): [4, 4, 64, 64] 0.254 vs 0.124 ms (2.05x), [1, 12, 8, 512] 0.182 vs "
            "0.080 ms (2.28x), [4, 12, 128, 128] 2.869 vs 1.201 ms (2.39x; s8 3.155 vs 1.221, 2.58x), [1, 12, 197, "
            "197] 1.675 vs 0.691 ms (2.43x), [1, 4, 17, 17] 0.014 vs 0.014 ms (1.05x); at ORT_ENABLE_EXTENDED "
            "onnxruntime forms it from either (1.00x). Its kernel loops per element (a table of exponentials, a "
            "division each) where Softmax is vectorized (benchmarks/results/quantized.md).",
            leaves_pipeline=True),),
        probe=Spec("QLinearSoftmax", MS, (*_quantized_input((2, 3, 8)), scalar("y_scale", 1, "float32"),
                                          scalar("y_zero_point", 0, "uint8")),
                   {"axis": -1, "opset": 13}, output_dtype="uint8"),
        stand_in=same_as_input_0,
        workspace=_softmax_transposes,
    ),
    Operator(
        "QLinearGlobalAveragePool", MS,
        support=kernels("QLinearGlobalAveragePool", "float32", "",
                        notes="X and the output of one type, u8 or s8, per tensor; NCHW (channels_last 0)"),
        probe=Spec("QLinearGlobalAveragePool", MS, (*_quantized_input((2, 3, 4, 5)), scalar("y_scale", 1, "float32"),
                                                    scalar("y_zero_point", 128, "uint8")),
                   {"channels_last": 0}, output_dtype="uint8"),
        contracts=(Contract("QLinearGlobalAveragePool", MS, "float32", (), ("qlinear-global-average-pool",)),),
        stand_in=_pooled,
    ),
)
