"""A QDQ Add or Mul node unit -> onnxruntime's QLinearAdd / QLinearMul (onnxruntime targets)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import dequantized, qlinear_unit_reason, quantized, shared_dequantizers, zero_point

MS = "com.microsoft"
# a, b and the output of one element type, u8 or s8
ONE_TYPE = frozenset({("uint8", "uint8", "uint8"), ("int8", "int8", "int8")})


@register
class FormQLinearBinary(PatternPass):
    """An elementwise Add or Mul between DequantizeLinear and QuantizeLinear runs on the quantized
    values (a residual Add, a gate's Mul):

        a_q ── DQ(a_s, a_z) ──┐
        b_q ── DQ(b_s, b_z) ── Add | Mul ── Q(y_s, y_z) ── y_q
          =>  a_q, b_q ── com.microsoft::QLinearAdd | QLinearMul(a_s, a_z, b_s, b_z, y_s, y_z) ── y_q

    the unit's float computation but for rounding (one step of y_s; verification judges such
    outputs in steps of their scale). What onnxruntime forms at ORT_ENABLE_EXTENDED (its QDQ
    selectors' binary rule): every scale and zero point one per tensor, a, b and y of one element
    type, u8 or s8; broadcasting as Add and Mul broadcast. No standard operator does this, so
    only the onnxruntime targets get it (at `--target onnx` the unit stays for the runtime).
    """

    name = "qlinear-binary"
    description = "Form com.microsoft QLinearAdd / QLinearMul from a QDQ Add or Mul node unit"
    label = "DQ + Add/Mul + Q -> QLinearAdd/QLinearMul"
    emits = (f"{MS}::QLinearAdd", f"{MS}::QLinearMul")
    keeps = ("a_dq", "b_dq")
    pattern = quantized(Op(("Add", "Mul"), dequantized("a"), dequantized("b"), name="binary"))

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        return np.dtype(np.float32), m.node("binary")  # the kernels' table lists their float scales' type

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        binary = m.node("binary")
        if "relu" in m.nodes:
            return Decline(f"{m.node('relu').name} is between {binary.name} and its QuantizeLinear: "
                           f"Q{binary.op} has no activation")
        return qlinear_unit_reason(m, g, binary, "a", "b", kernel_types=ONE_TYPE, per_tensor=("b",))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        binary = m.node("binary")
        inputs = [m.tensor("a_q"), m.tensor("a_scale"), zero_point(m, g, "a"),
                  m.tensor("b_q"), m.tensor("b_scale"), zero_point(m, g, "b"),
                  m.tensor("y_scale"), zero_point(m, g, "y")]
        formed = g.node(f"QLinear{binary.op}", inputs, name=f"{binary.name}_quantized",
                        outputs=[m.root.outputs[0]], domain=MS)
        return Replacement(nodes=[*shared_dequantizers(m, g), formed])

