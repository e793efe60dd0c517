"""com.microsoft DynamicQuantizeMatMul and MatMulIntegerToFloat: a dynamically quantized MatMul
and its scaling back to float in one kernel (dynamic-quantize-matmul)."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.rules import float_operands
from fuse_cli.ops.record import MS, Contract, Input, Operator, Spec, kernels

_M, _K, _N = 3, 8, 5


def _float_product(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """The output's shape and type: a float32 MatMul of A and B, each cast to float32 (A is an
    integer for MatMulIntegerToFloat, B always)."""
    if len(node.input) < 2:
        return []
    casts, operands = float_operands(node, node.input[0], node.input[1])
    return [*casts, helper.make_node("MatMul", operands, [node.output[0]])]


RECORDS = (
    Operator(
        "DynamicQuantizeMatMul", MS,
        support=kernels("DynamicQuantizeMatMul", "float32", "", notes="B int8 or uint8, a constant"),
        probe=Spec("DynamicQuantizeMatMul", MS, (
            Input("A", (2, _M, _K)),
            Input("B", (_K, _N), integers=(-127, 128), integer_dtype="int8"),
            Input("b_scale", (_N,)),
            Input("b_zero_point", (_N,), integers=(0, 1), integer_dtype="int8"),
            Input("bias", (_N,), optional=True))),
        contracts=(Contract("DynamicQuantizeMatMul", MS, "float32", (), ("dynamic-quantize-matmul",)),
                   Contract("DynamicQuantizeMatMul", MS, "float32", ("bias",), ("dynamic-quantize-matmul",))),
        stand_in=_float_product,
    ),
    Operator(
        "MatMulIntegerToFloat", MS,
        support=kernels("MatMulIntegerToFloat", "float32", "", notes="A and B int8 or uint8"),
        probe=Spec("MatMulIntegerToFloat", MS, (
            Input("A", (2, _M, _K), integers=(0, 256), integer_dtype="uint8"),
            Input("B", (_K, _N), integers=(-127, 128), integer_dtype="int8"),
            Input("a_scale", (1,)),
            Input("b_scale", (_N,)),
            Input("a_zero_point", (1,), integers=(100, 101), integer_dtype="uint8"),
            Input("b_zero_point", (_N,), integers=(0, 1), integer_dtype="int8"),
            Input("bias", (_N,), optional=True))),
        contracts=(Contract("MatMulIntegerToFloat", MS, "float32", (), ("dynamic-quantize-matmul",)),
                   Contract("MatMulIntegerToFloat", MS, "float32", ("bias",), ("dynamic-quantize-matmul",))),
        stand_in=_float_product,
    ),
)
