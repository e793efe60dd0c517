"""Fold a per-channel constant Mul or Add after a BatchNormalization into its scale and bias."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Const, Match, Op, Var, any_value, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.conv_weights import (FOLDABLE_DTYPES, batchnorm_reason, bn_params_reason, channel_vector,
                                           finite_fold)


BN = Op("BatchNormalization", Var("x"), Var("scale", const=True), Var("beta", const=True), Var("mean", const=True),
        Var("variance", const=True), name="bn")


class _FoldIntoBatchNorm(PatternPass):
    """Shared check and rewrite; subclasses say how the constant changes scale and bias."""

    tag: ClassVar[str]  # names the new constants

    def fold(self, scale: np.ndarray, beta: np.ndarray, c: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray]:
        """New (scale, bias) in float64 from c per channel."""
        raise NotImplementedError

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        bn, op = m.node("bn"), m.node("op")
        reason = batchnorm_reason(bn, g)
        if reason:
            return reason
        scale, c = constant_value(m.tensor("scale")), constant_value(m.tensor("c"))
        shape, dtype = g.shape(m.tensor("x")), g.dtype(m.tensor("x"))
        if shape is None or shape.rank < 2:
            return Decline(f"the rank of {bn.name}'s input is unknown or below 2")
        if dtype is None or dtype.type not in FOLDABLE_DTYPES or scale.dtype != dtype or c.dtype != dtype:
            return Decline(f"{op.name}'s constant ({c.dtype}), {bn.name}'s scale ({scale.dtype}) and input ({dtype}) "
                           "are not one float type")
        channels = scale.size
        reason = bn_params_reason(m, bn, channels, f"one per channel of {bn.name}'s input")
        if reason:
            return reason
        if op.op == "Div" and not np.all(c):
            return Decline(f"{op.name} divides by a constant that holds 0")
        if channel_vector(c, shape.rank, channels) is None:
            return Decline(f"{op.name}'s constant of shape {list(c.shape)} does not broadcast over the channel axis "
                           f"alone of {bn.name}'s rank-{shape.rank} output ({channels} channels)")
        if not finite_fold(c, lambda: self._folded(m, g), dtype):  # float16 gamma 100 times 2000; c = inf
            return Decline(f"{bn.name}'s scale or bias folded with {op.name}'s constant is not finite in {dtype}")
        return None

    def _folded(self, m: Match, g: GraphEditor) -> tuple[np.ndarray | None, np.ndarray]:
        scale = constant_value(m.tensor("scale"))
        beta = constant_value(m.tensor("beta")).astype(np.float64)
        c = channel_vector(constant_value(m.tensor("c")), g.shape(m.tensor("x")).rank, scale.size)
        return self.fold(scale.astype(np.float64), beta, c, m.node("op").op)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn = m.node("bn")
        scale = constant_value(m.tensor("scale"))
        new_scale, new_beta = self._folded(m, g)
        inputs = [m.tensor("x"),
                  m.tensor("scale") if new_scale is None else g.constant(f"{bn.name}_scale_{self.tag}",
                                                                         new_scale.astype(scale.dtype)),
                  g.constant(f"{bn.name}_bias_{self.tag}", new_beta.astype(scale.dtype)),
                  m.tensor("mean"), m.tensor("variance")]
        return Replacement(nodes=[rebuilt(bn, inputs=inputs, outputs=[m.node("op").outputs[0]])])


@register
class FoldMulIntoBatchNorm(_FoldIntoBatchNorm):
    """A per-channel constant multiplying a BatchNormalization's output scales its scale and bias:

        x ── BatchNormalization(gamma, beta, mean, var) ── Mul(c) ── y
          =>  x ── BatchNormalization(gamma * c, beta * c, mean, var) ── y
        (Div(c): the same with 1 / c)

    BN(x) * c = (gamma * c) * (x - mean) / sqrt(var + eps) + beta * c: exact but for rounding
    (float64, rounded once). c is a scalar or varies over the channel axis alone (as for
    conv-mul). Where conv-bn cannot fold the BatchNormalization (its Conv is shared, or it
    follows another operator), the Mul still goes: one pass over the tensor instead of two.
    """

    name = "bn-mul"
    description = "Fold a per-channel constant Mul or Div after BatchNormalization into its scale and bias"
    label = "BatchNormalization + Mul/Div (per-channel constant)"
    tag = "mulfolded"
    pattern = Op(("Mul", "Div"), BN, Const(any_value, name="c"), name="op")

    def fold(self, scale, beta, c, op):
        c = 1.0 / c if op == "Div" else c
        return scale * c, beta * c


@register
class FoldAddIntoBatchNorm(_FoldIntoBatchNorm):
    """A per-channel constant added to a BatchNormalization's output joins its bias:

        x ── BatchNormalization(gamma, beta, mean, var) ── Add(c) ── y
          =>  x ── BatchNormalization(gamma, beta + c, mean, var) ── y
    """

    name = "bn-add"
    description = "Fold a per-channel constant Add after BatchNormalization into its bias"
    label = "BatchNormalization + Add (per-channel constant)"
    tag = "addfolded"
    pattern = Op("Add", BN, Const(any_value, name="c"), name="op")

    def fold(self, scale, beta, c, op):
        return None, beta + c
