"""A QDQ GlobalAveragePool node unit -> onnxruntime's QLinearGlobalAveragePool (ort-cpu)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import dequantized, qlinear_unit_reason, quantized, shared_dequantizers, zero_point

MS = "com.microsoft"
# x and the output of one element type, u8 or s8 (the schema's one T)
ONE_TYPE = frozenset({("uint8", "uint8"), ("int8", "int8")})


@register
class FormQLinearGlobalAveragePool(PatternPass):
    """A GlobalAveragePool between DequantizeLinear and QuantizeLinear (a CNN's head) sums the
    quantized values in int32 and requantizes once:

        x_q ── DQ(x_s, x_z) ── GlobalAveragePool ──[ Relu ]── Q(y_s, y_z) ── y_q
          =>  x_q ── com.microsoft::QLinearGlobalAveragePool(x_s, x_z, y_s, y_z) ── y_q

        y_q = saturate(round(x_s / y_s * mean over the spatial axes of (x_q - x_z)) + y_z)

    the unit's float computation but for rounding (one step of y_s at most, probed on onnxruntime
    1.31 at 1x1 to 56x56 images, 1-D to 3-D; verification judges such outputs in steps of their
    scale). The kernel reads NCHW (channels_last 0), as GlobalAveragePool does, every scale and
    zero point one per tensor, x and y of one element type. What onnxruntime forms at
    ORT_ENABLE_EXTENDED (its QDQ selectors' unary rule); no standard operator does this, so only
    the onnxruntime targets get it.
    """

    name = "qlinear-global-average-pool"
    description = "Form com.microsoft QLinearGlobalAveragePool from a QDQ GlobalAveragePool node unit"
    label = "DQ + GlobalAveragePool + Q -> QLinearGlobalAveragePool"
    emits = (f"{MS}::QLinearGlobalAveragePool",)
    keeps = ("x_dq",)
    pattern = quantized(Op("GlobalAveragePool", dequantized("x"), name="pool"))

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        return np.dtype(np.float32), m.node("pool")  # the kernels' table lists their float scales' type

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return qlinear_unit_reason(m, g, m.node("pool"), "x", None, kernel_types=ONE_TYPE)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        pool = m.node("pool")
        inputs = [m.tensor("x_q"), m.tensor("x_scale"), zero_point(m, g, "x"), m.tensor("y_scale"),
                  zero_point(m, g, "y")]
        formed = g.node("QLinearGlobalAveragePool", inputs, {"channels_last": 0}, name=f"{pool.name}_quantized",
                        outputs=[m.root.outputs[0]], domain=MS)
        return Replacement(nodes=[*shared_dequantizers(m, g), formed])
