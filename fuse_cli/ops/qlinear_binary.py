"""com.microsoft QLinearAdd and QLinearMul: a QDQ Add or Mul node unit on the quantized values
(qlinear-binary, onnxruntime targets)."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.rules import float_operands
from fuse_cli.ops.record import MS, Contract, Input, Operator, Spec, kernels, scalar


def _requantized(op: str):
    def stand_in(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
        """The output's shape and type: the float op of A and B (cast), broadcast as Add and Mul
        broadcast, quantized by y_scale and y_zero_point."""
        inputs = list(node.input)
        if len(inputs) < 8 or not inputs[0] or not inputs[3] or not inputs[7]:
            return []
        out = node.output[0]
        casts, operands = float_operands(node, inputs[0], inputs[3])
        product = f"{out}::fuse-float"
        return [*casts, helper.make_node(op, operands, [product]),
                helper.make_node("QuantizeLinear", [product, inputs[6], inputs[7]], [out])]
    return stand_in


def _record(op: str) -> Operator:
    qualified = f"QLinear{op}"
    return Operator(
        qualified, MS,
        # The dtype is the scales' (float32, fixed by the schema), as for QGemm and DynamicQuantizeMatMul.
        support=kernels(qualified, "float32", "", notes="A, B and the output of one type, u8 or s8, per tensor"),
        probe=Spec(qualified, MS, (
            Input("A", (2, 3, 4), integers=(0, 256), integer_dtype="uint8"), scalar("A_scale", 1, "float32"),
            scalar("A_zero_point", 128, "uint8"),
            Input("B", (4,), integers=(0, 256), integer_dtype="uint8"), scalar("B_scale", 1, "float32"),
            scalar("B_zero_point", 128, "uint8"),
            scalar("C_scale", 2, "float32"), scalar("C_zero_point", 128, "uint8")), output_dtype="uint8"),
        contracts=(Contract(qualified, MS, "float32", (), ("qlinear-binary",)),),
        stand_in=_requantized(op),
    )


RECORDS = (_record("Add"), _record("Mul"))
