"""A QDQ MatMul node unit -> the standard QLinearMatMul (integer matrix product, requantized once)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import (dequantized, qlinear_unit_reason, quantized, shared_dequantizers,
                                        zero_point)


@register
class FormQLinearMatMul(PatternPass):
    """A MatMul between DequantizeLinear and QuantizeLinear runs in integers:

        a_q ── DQ(a_s, a_z) ──┐
        b_q ── DQ(b_s, b_z) ── MatMul ──[ Relu ]── Q(y_s, y_z) ── y_q
          =>  a_q ── QLinearMatMul(a_s, a_z, b_q, b_s, b_z, y_s, y_z) ── y_q

        y_q = saturate(round(sum (a_q - a_z)(b_q - b_z) * a_s * b_s / y_s) + y_z)

    the unit's float computation but for rounding (one quantization step at most per element;
    verification judges such outputs in steps of their scale). Either operand may be computed
    (attention's Q times K^T); a is quantized per tensor, b per tensor or, as a 2-D weight, per
    column (axis 1). Element types as the CPU kernels take them: u8 a with u8 or s8 b into u8,
    s8 a with s8 b into s8 (the u8 x s8 saturation qlinear-conv describes applies here too). The
    Relu and shared-DequantizeLinear rules are qlinear-conv's.
    """

    name = "qlinear-matmul"
    description = "Form QLinearMatMul from a QDQ MatMul node unit (DequantizeLinear -> MatMul -> QuantizeLinear)"
    label = "DQ + MatMul + Q -> QLinearMatMul"
    emits = ("QLinearMatMul",)
    min_opset = 10
    keeps = ("a_dq", "b_dq")
    pattern = quantized(Op("MatMul", dequantized("a"), dequantized("b"), name="matmul"))

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        return g.dtype(m.tensor("a_q")), m.node("matmul")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        matmul = m.node("matmul")
        return qlinear_unit_reason(m, g, matmul, "a", "b") or _operand_b_reason(m, g, matmul)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        matmul = m.node("matmul")
        inputs = [m.tensor("a_q"), m.tensor("a_scale"), zero_point(m, g, "a"),
                  m.tensor("b_q"), m.tensor("b_scale"), zero_point(m, g, "b"),
                  m.tensor("y_scale"), zero_point(m, g, "y")]
        formed = g.node("QLinearMatMul", inputs, name=f"{matmul.name}_quantized", outputs=[m.root.outputs[0]])
        return Replacement(nodes=[*shared_dequantizers(m, g), formed])


def _operand_b_reason(m: Match, g: GraphEditor, matmul: gs.Node) -> Decline | None:
    """b per tensor, or a 2-D b per column: its scale (and zero point) one per column, axis 1."""
    scale = constant_value(m.tensor("b_scale"))
    if scale.size == 1:
        return None
    shape, axis = g.shape(m.tensor("b_q")), m.node("b_dq").attrs.get("axis", 1)
    if shape is None or shape.rank != 2 or axis not in (1, -1) or shape.dims[1] != scale.size:
        return Decline(f"{matmul.name}'s b is quantized per axis {axis} of a {shape.rank if shape else '?'}-D "
                       "tensor; QLinearMatMul takes b per tensor or per column of a 2-D b")
    return None
