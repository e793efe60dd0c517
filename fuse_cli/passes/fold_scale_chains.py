"""Two scalings by constants in a row become one, where that gives the same bits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register

INTEGER_DTYPES = (np.int32, np.int64, np.uint32, np.uint64)
FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def _of(dtypes: tuple) -> Callable[[np.ndarray], bool]:
    """A Const test: a non-empty constant of one of `dtypes`."""
    return lambda value: value.dtype.type in dtypes and value.size > 0


def _chain(ops: tuple[str, ...], dtypes: tuple) -> Op:
    """x ── op(a) ── op(b), a and b constants of `dtypes` (ONNX gives x, a and b one type)."""
    inner = Op(ops, Var("x"), Const(_of(dtypes), name="inner_c"), name="inner")
    return Op(ops, inner, Const(_of(dtypes), name="outer_c"), name="outer")


@register
class FoldScaleChains(PatternPass):
    """x ── Mul/Div(a) ── Mul/Div(b) ── y   =>   x ── Mul/Div(c) ── y

    Integers (Mul then Mul): c = a * b, exact in wrapping two's-complement arithmetic. Integer
    Div truncates, so it never folds.

    Floats: (x * a) * b rounds twice, x * (a * b) once, so in general they differ in the last
    bit. They are equal bit for bit when one factor is a power of two: scaling by 2^k is exact,
    so the one rounding left is the same on both sides. With b = 2^k: x*a*b = x*(a*b),
    x/a*b = x/(a/b); with a = 2^k: x*a*b = x*(b*a), x/a*b = x*(b/a), x*a/b = x/(b/a),
    x/a/b = x/(b*a). c is computed in float64 and must round-trip to the dtype unchanged.

    Overflow is kept exact: the outer scaling must not shrink (|b| >= 1 for Mul, <= 1 for Div).
    Where it shrinks, x*a can overflow to inf while x*(a*b) stays finite (x*3e38*0.5 at x = 2:
    inf against 3e38), so such chains are declined. The one caveat left, stated rather than
    hidden: an intermediate in the subnormal range (|x*a| below 1.2e-38 in float32) is rounded
    there first, so the chain and the single scaling can differ in its last bits.
    """

    name = "fold-scale-chains"
    description = "Fold x*a*b, x/a*b (etc.) into one Mul/Div where the result is bit-exact"
    label = "constant scaling chain"
    # an integer Div truncates: a chain with one is another computation, not a near-miss
    pattern = Alt(_chain(("Mul", "Div"), FLOAT_DTYPES), _chain(("Mul",), INTEGER_DTYPES))

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        inner, outer = m.node("inner"), m.node("outer")
        a, b = constant_value(m.tensor("inner_c")), constant_value(m.tensor("outer_c"))
        if a.dtype != b.dtype:  # not a valid model (Mul and Div take one type): said, not folded
            return Decline(f"{inner.name}'s constant is {a.dtype}, {outer.name}'s {b.dtype}")
        if a.dtype.type in FLOAT_DTYPES and _shrinks(b, outer.op):
            return Decline(f"{outer.name} scales down: where {inner.name}'s result overflows to inf, one scaling "
                           "would give a finite value")
        if _folded(m) is not None:
            return None
        if _power_of_two(a) or _power_of_two(b):
            return Decline(f"folding {inner.name}'s and {outer.name}'s constants leaves the {a.dtype} range")
        return Decline(f"neither {inner.name}'s nor {outer.name}'s constant is a power of two: the two roundings "
                       "of the chain and the one of a single scaling can differ in the last bit")

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        op, c = _folded(m)
        outer = m.node("outer")
        node = g.node(op, [m.tensor("x"), gs.Constant(g.unique_name(f"{outer.name}_factor"), c)],
                      name=f"{outer.name}_folded",
                      outputs=[outer.outputs[0]])  # not g.constant, whose ascontiguousarray makes a scalar 1-D
        return Replacement(nodes=[node])


def _folded(m: Match) -> tuple[str, np.ndarray] | None:
    """The single (op, constant) that gives the same bits, or None."""
    a, b = constant_value(m.tensor("inner_c")), constant_value(m.tensor("outer_c"))
    inner, outer = m.node("inner").op, m.node("outer").op
    if a.dtype.type in INTEGER_DTYPES:
        return "Mul", np.asarray(a * b, dtype=a.dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if _power_of_two(b):  # the outer scaling is exact: fold it into the inner constant
        op, c = inner, (a64 * b64 if inner == outer else a64 / b64)
    elif _power_of_two(a):  # the inner scaling is exact: fold it into the outer constant
        op, c = outer, (b64 * a64 if inner == outer else b64 / a64)
    else:
        return None
    with np.errstate(over="ignore", under="ignore"):
        rounded = c.astype(a.dtype)
    if not np.array_equal(rounded.astype(np.float64), c) or not np.all(np.isfinite(rounded)) or np.any(rounded == 0):
        return None
    return op, np.asarray(rounded)


def _shrinks(b: np.ndarray, op: str) -> bool:
    """Does the outer scaling make some value smaller in magnitude (or is its factor not finite)?"""
    magnitude = np.abs(b.astype(np.float64))
    if not np.all(np.isfinite(magnitude)) or np.any(magnitude == 0):
        return True
    return bool(np.any(magnitude < 1)) if op == "Mul" else bool(np.any(magnitude > 1))


def _power_of_two(value: np.ndarray) -> bool:
    """Every element +-2^k, in the dtype's normal range (so scaling by it is exact)."""
    v = value.astype(np.float64)
    if not np.all(np.isfinite(v)) or np.any(v == 0):
        return False
    mantissa, _ = np.frexp(np.abs(v))
    return bool(np.all(mantissa == 0.5)) and bool(np.all(np.abs(v) >= np.finfo(value.dtype).tiny))
