"""A QDQ Conv node unit -> the standard QLinearConv (integer convolution, requantized once)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import (bias_reason, dequantized, qlinear_unit_reason, quantized, shared_dequantizers,
                                        zero_point)

X, W = dequantized("x"), dequantized("w", const=True)


@register
class FormQLinearConv(PatternPass):
    """A Conv between DequantizeLinear and QuantizeLinear, as a quantizer writes it, runs in integers:

        x_q ── DQ(x_s, x_z) ──┐
        w_q ── DQ(w_s, w_z) ── Conv ──[ Relu ]── Q(y_s, y_z) ── y_q
        b_q ── DQ(b_s, 0) ────┘
          =>  x_q ── QLinearConv(x_s, x_z, w_q, w_s, w_z, y_s, y_z, b_q) ── y_q

        y_q = saturate(round((sum (x_q - x_z)(w_q - w_z) + b_q) * x_s * w_s / y_s) + y_z)

    which is what the unit computes in float, but for rounding: the kernel accumulates exactly in
    int32 and requantizes with a float multiplier, so an element may land one quantization step
    from the float Conv's (verification judges such outputs in steps of their scale). The weight
    is a constant, per tensor or per output channel (axis 0, one zero point); the bias, when
    there is one, an int32 at scale x_s * w_s with zero point 0, as the ONNX spec requires. A Relu
    before the Q is dropped where the Q's zero point is its type's minimum (the clamp at 0 is
    then the quantization's own), as onnxruntime's QDQ selectors do. Element types as the CPU
    kernels take them: u8 x with u8 or s8 w into u8, s8 x with s8 w into s8. (On x86 CPUs without
    VNNI onnxruntime's u8 x s8 kernel sums pairs of products in int16, which saturates for weights
    beyond +-64 against activations near 255: its own QLinearConv, formed at ORT_ENABLE_EXTENDED,
    does the same, and quantize_static's reduce_range=True, 7-bit weights, avoids it. fuse
    writes the weights as the quantizer did: stored as u8, they ran 1.3x slower.) A DequantizeLinear
    another node reads too stays for that reader. At ORT_ENABLE_EXTENDED onnxruntime forms the
    same QLinearConv itself; formed here, the model runs quantized at every level and on any
    runtime with the standard operator.
    """

    name = "qlinear-conv"
    description = "Form QLinearConv from a QDQ Conv node unit (DequantizeLinear -> Conv -> QuantizeLinear)"
    label = "DQ + Conv + Q -> QLinearConv"
    emits = ("QLinearConv",)
    min_opset = 10
    keeps = ("x_dq", "w_dq", "b_dq")
    pattern = quantized(Alt(Op("Conv", X, W, dequantized("b"), name="conv"), Op("Conv", X, W, name="conv")))

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        return g.dtype(m.tensor("x_q")), m.node("conv")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        conv = m.node("conv")
        return qlinear_unit_reason(m, g, conv, "x", "w") or _weight_reason(m, conv) or bias_reason(m, g, conv)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        conv = m.node("conv")
        inputs = [m.tensor("x_q"), m.tensor("x_scale"), zero_point(m, g, "x"),
                  m.tensor("w_q"), m.tensor("w_scale"), _one_value(g, zero_point(m, g, "w")),
                  m.tensor("y_scale"), zero_point(m, g, "y")]
        if m.tensor("b_q") is not None:
            inputs.append(m.tensor("b_q"))
        formed = g.node("QLinearConv", inputs, conv.attrs, name=f"{conv.name}_quantized", outputs=[m.root.outputs[0]])
        return Replacement(nodes=[*shared_dequantizers(m, g), formed])


def _weight_reason(m: Match, conv: gs.Node) -> Decline | None:
    """Per tensor, or per output channel along axis 0 with one zero point for every channel."""
    scale, weight = constant_value(m.tensor("w_scale")), m.tensor("w_q")
    if scale.size == 1:
        return None
    if m.node("w_dq").attrs.get("axis", 1) != 0 or scale.size != weight.shape[0]:
        return Decline(f"{conv.name}'s weight is quantized along axis {m.node('w_dq').attrs.get('axis', 1)}, "
                       "not per output channel (axis 0)")
    zero = constant_value(m.tensor("w_zero"))
    if zero is not None and np.unique(zero).size > 1:
        return Decline(f"{conv.name}'s per-channel weight zero points differ; onnxruntime's QLinearConv takes one")
    return None


def _one_value(g: GraphEditor, zero: gs.Tensor) -> gs.Tensor:
    """The weight's zero point as one value: per channel they are all equal (checked)."""
    values = constant_value(zero)
    return zero if values.size == 1 else g.constant(f"{zero.name}_one", values.reshape(-1)[:1].reshape(()))
