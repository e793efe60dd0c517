"""Fold a per-channel constant Mul or Add after a Conv/ConvTranspose into its weight and bias."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Const, Match, Op, Var, any_value, constant_value
from fuse_cli.toolkit.conv_weights import (FOLDABLE_DTYPES, channel_vector, conv_bias_reason, finite_fold,
                                           output_channels, refolded_conv, scale_output_channels)
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activations import gates_itself

CONV = Op(("Conv", "ConvTranspose"), Var("x"), Var("weight", const=True), Var("bias", const=True, optional=True),
          name="conv")


class _FoldChannelConstant(PatternPass):
    """Shared check and rewrite; subclasses say which arithmetic and how it folds."""

    tag: ClassVar[str]  # names the new constants
    requires = (Requirement(
        "The constant is not the first step of an activation that gates the Conv's output by itself, "
        "x * f(x) (paddle2onnx's hard swish x * relu6(x + 3) / 6, GELU's x / sqrt(2)): that + 3 is no bias, "
        "and x, read again by the gate, cannot fold: silent, not a near-miss beside the activation's own.",
        lambda m, g: not gates_itself(m.node("conv").outputs[0], m.node("op"))),)

    def fold(self, conv: gs.Node, w: np.ndarray, b: np.ndarray | None,
             c: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """New (weight, bias) in float64 from c per channel; None keeps the weight / adds no bias."""
        raise NotImplementedError

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        conv, op = m.node("conv"), m.node("op")
        w, c = constant_value(m.tensor("weight")), constant_value(m.tensor("c"))
        if w.dtype.type not in FOLDABLE_DTYPES:
            return Decline(f"{conv.name}'s weight has dtype {w.dtype}, not a float type that can be folded")
        if c.dtype != w.dtype:
            return Decline(f"{op.name}'s constant has dtype {c.dtype}, the weight {w.dtype}")
        channels = output_channels(conv, w)
        if op.op == "Div" and not np.all(c):
            return Decline(f"{op.name} divides by a constant that holds 0")
        if channel_vector(c, w.ndim, channels) is None:
            return (Decline(f"{op.name}'s constant of shape {list(c.shape)} does not broadcast over the channel axis "
                    f"alone of {conv.name}'s rank-{w.ndim} output ({channels} channels)"))
        reason = conv_bias_reason(m, conv, channels)
        if reason:
            return reason
        if not finite_fold(c, lambda: self._folded(m), w.dtype):
            return Decline(f"{conv.name}'s weight or bias folded with {op.name}'s constant is not finite in {w.dtype}")
        return None

    def _folded(self, m: Match) -> tuple[np.ndarray | None, np.ndarray | None]:
        conv, op = m.node("conv"), m.node("op")
        w = constant_value(m.tensor("weight"))
        c = channel_vector(constant_value(m.tensor("c")), w.ndim, output_channels(conv, w))
        c = 1.0 / c if op.op == "Div" else c
        b = constant_value(m.tensor("bias")).astype(np.float64) if m.tensor("bias") is not None else None
        return self.fold(conv, w.astype(np.float64), b, c)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        conv, op = m.node("conv"), m.node("op")
        w = constant_value(m.tensor("weight"))
        new_w, new_b = self._folded(m)
        weight = (m.tensor("weight") if new_w is None
                  else g.constant(f"{conv.name}_weight_{self.tag}", new_w.astype(w.dtype)))
        inputs = [m.tensor("x"), weight]
        if new_b is not None:
            inputs.append(g.constant(f"{conv.name}_bias_{self.tag}", new_b.astype(w.dtype)))
        return Replacement(nodes=[refolded_conv(conv, inputs, op.outputs[0])])


@register
class FoldMulIntoConv(_FoldChannelConstant):
    """A per-output-channel constant multiplying a Conv/ConvTranspose output scales its weights:

        x ── Conv(W, b) ── Mul(c) ── y     =>   x ── Conv(W * c, b * c) ── y
        x ── Conv(W, b) ── Div(c) ── y     =>   x ── Conv(W / c, b / c) ── y

    c is a scalar or varies over the channel axis only ([C,1,1], [1,C,1,1] for 2-D; generally
    1 on every axis but axis 1 after right-aligned broadcasting, and no larger rank than the
    output, so the result shape is unchanged). W is scaled on its output-channel axis (axis 0 for
    Conv, axis 1 per group for ConvTranspose). Mul operands in either order; Div only as Conv / c.
    float64, rounded once: within an ulp of the unfused result, which rounds twice.
    """

    name = "conv-mul"
    description = "Fold a per-channel constant Mul or Div after Conv/ConvTranspose into its weights and bias"
    label = "Conv + Mul/Div (per-channel constant)"
    tag = "mulfolded"
    pattern = Op(("Mul", "Div"), CONV, Const(any_value, name="c"), name="op")

    def fold(self, conv, w, b, c):
        return scale_output_channels(conv, w, c), None if b is None else b * c


@register
class FoldAddIntoConvBias(_FoldChannelConstant):
    """A per-output-channel constant added to a Conv/ConvTranspose output joins its bias:

        x ── Conv(W, b) ── Add(c) ── y     =>   x ── Conv(W, b + c) ── y

    Same broadcast condition on c as conv-mul; a bias is created when the Conv has none (b = 0).
    The weight tensor is reused as is.
    """

    name = "conv-add"
    description = "Fold a per-channel constant Add after Conv/ConvTranspose into its bias"
    label = "Conv + Add (per-channel constant)"
    tag = "addfolded"
    pattern = Op("Add", CONV, Const(any_value, name="c"), name="op")

    def fold(self, conv, w, b, c):
        return None, c if b is None else b + c
