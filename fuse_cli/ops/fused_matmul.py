"""com.microsoft FusedMatMul: MatMul with transposed operands and a scale (fused-matmul)."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.record import MS, Contract, Input, Operator, Spec, kernels
from fuse_cli.ops.rules import attributes


def _as_matmul(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    inputs, out = list(node.input), node.output[0]
    attrs = attributes(node)
    if len(inputs) < 2 or attrs.get("transBatchA") or attrs.get("transBatchB"):
        return []
    # A transposed operand as a one-input Einsum, which needs no rank; MatMul broadcasts.
    nodes, operands = [], []
    for side, name in (("A", inputs[0]), ("B", inputs[1])):
        if attrs.get(f"trans{side}"):
            if opset < 12:
                return []
            operands.append(f"{out}::fuse-{side}-t")
            nodes.append(helper.make_node("Einsum", [name], operands[-1:], equation="...ij->...ji"))
        else:
            operands.append(name)
    return [*nodes, helper.make_node("MatMul", operands, [out])]


RECORDS = (Operator(
    "FusedMatMul", MS,
    support=kernels("FusedMatMul", "float32 float64", "float32 float16 bfloat16 float64"),
    probe=Spec("FusedMatMul", MS, (Input("A", (2, 3, 4)), Input("B", (2, 5, 4))), {"alpha": 0.5, "transB": 1}),
    contracts=(Contract("FusedMatMul", MS, "float32", (), ("fused-matmul",)),),
    stand_in=_as_matmul,
),)
