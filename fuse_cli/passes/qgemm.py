"""A QDQ Gemm node unit -> onnxruntime's QGemm (integer matrix product with an int32 bias, requantized once)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import (bias_reason, dequantized, qlinear_unit_reason, quantized, shared_dequantizers,
                                        zero_point)

MS = "com.microsoft"
X, W = dequantized("x"), dequantized("w", const=True)


@register
class FormQGemm(PatternPass):
    """A Gemm between DequantizeLinear and QuantizeLinear runs in integers on onnxruntime:

        x_q ── DQ(x_s, x_z) ──┐
        w_q ── DQ(w_s, w_z) ── Gemm(alpha, transA, transB) ──[ Relu ]── Q(y_s, y_z) ── y_q
        b_q ── DQ(b_s, 0) ────┘
          =>  x_q ── com.microsoft::QGemm(x_s, x_z, w_q, w_s, w_z, b_q, y_s, y_z) ── y_q

    the unit's float computation but for rounding (a step at most per element), as onnxruntime
    forms it at ORT_ENABLE_EXTENDED: there is no standard quantized Gemm (QLinearMatMul has no
    bias), so `--target onnx` leaves the unit. The weight is a constant, per tensor or per column
    of the product (axis 0 of a transposed weight, else 1); the bias an int32 of one value per
    column at scale x_s * w_s with zero point 0, and beta 1 (QGemm has none). Element types,
    the Relu and shared-DequantizeLinear rules are qlinear-conv's.
    """

    name = "qgemm"
    description = "Form com.microsoft QGemm from a QDQ Gemm node unit (DequantizeLinear -> Gemm -> QuantizeLinear)"
    label = "DQ + Gemm + Q -> QGemm"
    emits = (f"{MS}::QGemm",)
    keeps = ("x_dq", "w_dq", "b_dq")
    pattern = quantized(Alt(Op("Gemm", X, W, dequantized("b"), name="gemm"), Op("Gemm", X, W, name="gemm")))

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        return constant_value(m.tensor("x_scale")).dtype, m.node("gemm")  # the table's dtype: the scales'

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        gemm = m.node("gemm")
        return (qlinear_unit_reason(m, g, gemm, "x", "w") or _weight_reason(m, gemm)
                or _bias_shape_reason(m, gemm) or bias_reason(m, g, gemm))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        gemm = m.node("gemm")
        bias = m.tensor("b_q") if m.tensor("b_q") is not None else gs.Variable.empty()
        inputs = [m.tensor("x_q"), m.tensor("x_scale"), zero_point(m, g, "x"),
                  m.tensor("w_q"), m.tensor("w_scale"), zero_point(m, g, "w"),
                  bias, m.tensor("y_scale"), zero_point(m, g, "y")]
        attrs = {key: gemm.attrs[key] for key in ("alpha", "transA", "transB") if key in gemm.attrs}
        formed = g.node("QGemm", inputs, attrs, name=f"{gemm.name}_quantized", outputs=[m.root.outputs[0]], domain=MS)
        return Replacement(nodes=[*shared_dequantizers(m, g), formed])


def _columns_axis(gemm: gs.Node) -> int:
    """The weight's axis that indexes the product's columns."""
    return 0 if gemm.attrs.get("transB", 0) else 1


def _weight_reason(m: Match, gemm: gs.Node) -> Decline | None:
    scale, weight = constant_value(m.tensor("w_scale")), m.tensor("w_q")
    if scale.size == 1:
        return None
    axis = _columns_axis(gemm)
    if m.node("w_dq").attrs.get("axis", 1) != axis or scale.size != weight.shape[axis]:
        return Decline(f"{gemm.name}'s weight is quantized along axis {m.node('w_dq').attrs.get('axis', 1)}, "
                       f"not per column of the product (axis {axis})")
    return None


def _bias_shape_reason(m: Match, gemm: gs.Node) -> Decline | None:
    if m.tensor("b_q") is None:
        return None
    if gemm.attrs.get("beta", 1.0) != 1.0:
        return Decline(f"{gemm.name} scales its bias by beta {gemm.attrs['beta']}; QGemm has no beta")
    bias, columns = m.tensor("b_q"), m.tensor("w_q").shape[_columns_axis(gemm)]
    if tuple(bias.shape) != (columns,):
        return Decline(f"{gemm.name}'s bias has shape {list(bias.shape)}, not one value per column ({columns})")
    return None
