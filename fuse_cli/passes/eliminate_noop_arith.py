"""Arithmetic and logic with the identity element: x*1, x/1, x+0, x-0, x and true, x or/xor false leave x as it was."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register

# the ops whose identity element is 0 (false) and those whose is 1 (true); a bool constant only meets
# And/Or/Xor: ONNX's arithmetic operators take no bool
BY_IDENTITY = {0: ("Add", "Sub", "Or", "Xor"), 1: ("Mul", "Div", "And")}


def all_equal_to(element: int):
    """A Const test: every element is `element` (x*0 or x+1 is another computation, not a near-miss)."""
    return lambda value: value.size > 0 and bool(np.all(value == element))


@register
class EliminateNoopArithmetic(PatternPass):
    """x ── Mul/Div(1) ── y,  x ── Add/Sub(0) ── y,  x ── And(true) / Or(false) / Xor(false) ── y
       =>   readers of y read x

    Mul, Add, And, Or and Xor in either order (torch's dynamo export writes And(ones, mask)); Sub
    and Div only with the constant second (0 - x and 1 / x are not x). Every element of the constant
    must be the identity element, and the constant must
    not broadcast x to a larger shape: each of its dims, aligned from the right, is 1 or x's
    static dim there, and its rank is at most x's. Exact for integers; for floats x*1, x/1, x-0
    give x bit for bit, and x+0 too except that a -0.0 in x comes out as +0.0 (an equal value);
    the logic forms are exact.
    """

    name = "eliminate-noop-arith"
    description = "Remove x*1, x/1, x+0, x-0, x and true, x or/xor false with a constant that does not broadcast x"
    label = "x*1, x/1, x+0, x-0, x and true, x or false"
    pattern = Alt(*(Op(ops, Var("x"), Const(all_equal_to(element), name="constant"), name="op")
                    for element, ops in BY_IDENTITY.items()))

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        node, x = m.node("op"), m.tensor("x")
        value = constant_value(m.tensor("constant"))
        x_dtype = g.dtype(x)
        if x_dtype is not None and x_dtype != value.dtype:
            return Decline(f"{node.name}'s constant has dtype {value.dtype}, {x.name!r} has {x_dtype}")
        dims = g.shape(x)
        if dims is None and value.ndim > 0:
            return Decline(f"{node.name}: the rank of {x.name!r} is unknown, so its constant may broadcast it")
        if dims is not None:
            if value.ndim > dims.rank:
                return (Decline(f"{node.name}'s constant of shape {list(value.shape)} broadcasts {x.name!r} of shape "
                        f"{list(dims.dims)} to a higher rank"))
            trailing = dims.dims[dims.rank - value.ndim:]
            if any(c != 1 and c != d for c, d in zip(value.shape, trailing)):
                return (Decline(f"{node.name}'s constant of shape {list(value.shape)} may broadcast "
                        f"{x.name!r} of shape {list(dims.dims)} to a larger shape"))
        return Decline.unless(g.reroute_reason(node.outputs[0], x))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(reroute=[(m.node("op").outputs[0], m.tensor("x"))])
