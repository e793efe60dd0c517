"""Piecewise-linear activations written out with Clip -> HardSigmoid and HardSwish."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value, scalar_close
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.toolkit.shapes import rank_reason
from fuse_cli.pipeline.registry import register

X = Var("x")
SCALAR = Const(lambda v: v.size == 1 and np.issubdtype(v.dtype, np.floating))
# alpha * x + beta as x*a + b, x/d + b, or shifted first: (x + c)*k, (x + c)/d
AFFINE = Alt(
    Op("Add", Op(("Mul", "Div"), X, Const(SCALAR.test, "scale"), name="scale_op"), Const(SCALAR.test, "shift")),
    Op(("Mul", "Div"), Op("Add", X, Const(SCALAR.test, "shift"), name="shift_first"), Const(SCALAR.test, "scale"),
       name="scale_op"),
)


def clamp(of) -> Alt:
    """`of` clamped to [low, high]: Clip (bounds as inputs from opset 11, else attributes), or
    Min(Max(of, low), high) / Max(Min(of, high), low) with constant bounds."""
    return Alt(Op("Clip", of, Var("low", optional=True), Var("high", optional=True), name="clip"),
               Op("Min", Op("Max", of, Const(SCALAR.test, "low")), Const(SCALAR.test, "high"), name="clip"),
               Op("Max", Op("Min", of, Const(SCALAR.test, "high")), Const(SCALAR.test, "low"), name="clip"))


SHIFTED = Op("Add", X, Const(scalar_close(3.0), "shift"), name="shift_first")
SIXTH = 1.0 / 6.0
# relu6(x + 3) / 6, also as * (1/6)
RELU6_SIXTH = Alt(Op("Div", clamp(SHIFTED), Const(scalar_close(6.0), "scale"), name="scale_op"),
                  Op("Mul", clamp(SHIFTED), Const(scalar_close(SIXTH), "scale"), name="scale_op"))
RELU6_SHIFTED = clamp(Op("Add", X, Const(scalar_close(3.0))))


@register
class FuseHardSigmoid(PatternPass):
    """hard_sigmoid(x) = max(0, min(1, alpha * x + beta))

        x ── Mul(alpha) ── Add(beta) ── Clip(0, 1) ── y     =>   x ── HardSigmoid(alpha, beta) ── y

    alpha * x + beta also as x / d + beta, (x + c) * k or (x + c) / d (alpha = k or 1/d, beta = c * alpha);
    the clamp as Clip (bounds as inputs or attributes), Min(Max(., 0), 1) or Max(Min(., 1), 0);
    and relu6(x + 3) / 6 = Clip(x + 3, 0, 6) / 6 (or * (1/6)) = HardSigmoid(1/6, 0.5). HardSigmoid
    computes alpha * x + beta in float32, so the result matches the written order of operations to
    float32 rounding (a few ulp).
    """

    name = "hard-sigmoid"
    description = "Fuse Clip(alpha * x + beta, 0, 1) or relu6(x + 3) / 6 into HardSigmoid"
    label = "Clip(affine, 0, 1) -> HardSigmoid"
    min_opset = 6
    pattern = Alt(RELU6_SIXTH, clamp(AFFINE))  # the scale after the clamp is the later root

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        clip, x = m.node("clip"), m.tensor("x")
        if g.dtype(x) != np.float32:
            return Decline(f"{clip.name} computes in {g.dtype(x)}; only float32 is matched")
        if m.node("scale_op").op == "Div" and constant_value(m.tensor("scale")).reshape(-1)[0] == 0:
            return Decline(f"{m.node('scale_op').name} divides by zero")
        bounds = clip_bounds(m)
        if bounds is None:
            return Decline(f"{clip.name}'s bounds are computed at run time")
        clamps = f"{clip.name} clamps to [{bounds[0]:g}, {bounds[1]:g}]"
        if m.node("scale_op") is not m.root:
            return rank_reason(m, g) if bounds == [0.0, 1.0] else Decline(f"{clamps}; HardSigmoid clamps to [0, 1]")
        # the scale after the clamp must map [low, high] onto [0, 1]: [0, 6] * (1/6)
        high = 1.0 / _alpha(m)
        if not np.allclose(bounds, [0.0, high], rtol=1e-6, atol=0):
            return Decline(f"{clamps} before {m.root.name} scales by {_alpha(m):g}; "
                           f"HardSigmoid needs [0, {high:g}] there")
        return rank_reason(m, g)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        alpha = _alpha(m)
        beta = float(constant_value(m.tensor("shift")).reshape(-1)[0])
        if "shift_first" in m.nodes:  # (x + c) * alpha = alpha * x + c * alpha
            beta *= alpha
        node = g.node("HardSigmoid", [m.tensor("x")], {"alpha": alpha, "beta": beta},
                      name=f"{m.node('clip').name}_hardsigmoid", outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


@register
class FuseHardSwish(PatternPass):
    """hard_swish(x) = x * HardSigmoid(x; alpha=1/6, beta=0.5) = x * relu6(x + 3) / 6

        x ─┬─ HardSigmoid(1/6, 0.5) ─┐
           └──────────────────────── Mul ── y       =>   x ── HardSwish ── y

    The gate also as relu6(x + 3) / 6 or relu6(x + 3) * (1/6), and the division last:
    (x * relu6(x + 3)) / 6 or * (1/6); relu6 as any clamp hard-sigmoid reads, bounds [0, 6].
    Equal to float32 rounding.
    """

    name = "hard-swish"
    description = "Fuse x * HardSigmoid(x) (alpha 1/6, beta 0.5) or x * relu6(x + 3) / 6 into HardSwish"
    label = "x * hard_sigmoid(x) -> HardSwish"
    min_opset = 14
    pattern = Alt(Op("Div", Op("Mul", X, RELU6_SHIFTED, name="gate"), Const(scalar_close(6.0)), name="mul"),
                  Op("Mul", Op("Mul", X, RELU6_SHIFTED, name="gate"), Const(scalar_close(SIXTH)), name="mul"),
                  Op("Mul", X, Alt(Op("HardSigmoid", X, name="gate"),
                                   Op("Div", RELU6_SHIFTED, Const(scalar_close(6.0)), name="gate"),
                                   Op("Mul", RELU6_SHIFTED, Const(scalar_close(SIXTH)), name="gate")), name="mul"))

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        gate, mul = m.node("gate"), m.node("mul")
        if g.dtype(m.tensor("x")) != np.float32:
            return Decline(f"{mul.name} computes in {g.dtype(m.tensor('x'))}; only float32 is matched")
        alpha, beta = gate.attrs.get("alpha", 0.2), gate.attrs.get("beta", 0.5)
        if gate.op == "HardSigmoid" and not np.allclose([alpha, beta], [SIXTH, 0.5], rtol=1e-6, atol=0):
            return Decline(f"{gate.name} has alpha={alpha:g}, beta={beta:g}; HardSwish is alpha=1/6, beta=0.5")
        bounds = clip_bounds(m) if "clip" in m.nodes else [0.0, 6.0]
        if bounds != [0.0, 6.0]:
            where = m.node("clip").name
            return Decline(f"{where}'s bounds are computed at run time" if bounds is None
                           else f"{where} clamps x + 3 to [{bounds[0]:g}, {bounds[1]:g}]; relu6 clamps to [0, 6]")
        return rank_reason(m, g)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        node = g.node("HardSwish", [m.tensor("x")], name=f"{m.node('mul').name}_hardswish", outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


def clip_bounds(m: Match) -> list[float] | None:
    """[low, high] of the matched clamp, or None when a bound is computed at run time."""
    clip = m.node("clip")
    bounds = [_bound(m.tensor(name), clip.attrs.get(attr), default)
              for name, attr, default in (("low", "min", -np.inf), ("high", "max", np.inf))]
    return None if None in bounds else bounds


def _alpha(m: Match) -> float:
    scale = float(constant_value(m.tensor("scale")).reshape(-1)[0])
    return scale if m.node("scale_op").op == "Mul" else 1.0 / scale


def _bound(tensor: gs.Tensor | None, attr: float | None, default: float) -> float | None:
    """A Clip bound: the constant input (opset >= 11), the attribute (opset < 11), or the default."""
    if tensor is not None:
        value = constant_value(tensor)
        return None if value is None else float(value.reshape(-1)[0])
    return float(attr) if attr is not None else default
