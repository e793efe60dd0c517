"""com.microsoft QGemm: a QDQ Gemm node unit in one integer kernel (qgemm, onnxruntime targets)."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.record import MS, Contract, Input, Operator, Spec, kernels, scalar
from fuse_cli.ops.rules import attributes, float_operands


def _quantized_gemm(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """The output's shape and type: a float32 Gemm of A and B cast to float32 (transA, transB kept),
    quantized by y_scale and y_zero_point where the node has them (else the float product)."""
    inputs = list(node.input) + [""] * (9 - len(node.input))
    if not inputs[0] or not inputs[3]:
        return []
    out, attrs = node.output[0], attributes(node)
    nodes, operands = float_operands(node, inputs[0], inputs[3])
    product = f"{out}::fuse-product" if inputs[8] else out
    nodes.append(helper.make_node("Gemm", operands, [product], transA=attrs.get("transA", 0),
                                  transB=attrs.get("transB", 0)))
    if inputs[8]:
        nodes.append(helper.make_node("QuantizeLinear", [product, inputs[7], inputs[8]], [out]))
    return nodes


RECORDS = (Operator(
    "QGemm", MS,
    # The dtype is the scales' (the float type parameter T), as for DynamicQuantizeMatMul.
    support=kernels("QGemm", "float32", "",
                    notes="A u8 with B u8 or s8, or A s8 with B s8; C int32 at a_scale * b_scale; output u8/s8 "
                          "(y_scale, y_zero_point) or float"),
    # The probe is the float-output form (the probe's output is declared at the contract's dtype);
    # the quantized-output form qgemm writes is checked by tests/test_qlinear.py against the unit.
    probe=Spec("QGemm", MS, (
        Input("A", (3, 8), integers=(0, 256), integer_dtype="uint8"), scalar("a_scale", 1),
        Input("a_zero_point", (), integers=(100, 101), integer_dtype="uint8"),
        Input("B", (8, 5), integers=(-127, 128), integer_dtype="int8"), scalar("b_scale", 1),
        Input("b_zero_point", (), integers=(0, 1), integer_dtype="int8"),
        Input("C", (5,), True, integers=(-4096, 4096), integer_dtype="int32"))),
    contracts=(Contract("QGemm", MS, "float32", (), ("qgemm",)), Contract("QGemm", MS, "float32", ("C",), ("qgemm",))),
    stand_in=_quantized_gemm,
),)
