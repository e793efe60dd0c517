"""GELU written out with Erf or Tanh -> the standard Gelu operator (opset 20)."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activations import ERF_GATE, HALF, TANH_GATE, X
from fuse_cli.toolkit.shapes import rank_reason

GATE = Alt(ERF_GATE, TANH_GATE)
# the opset-20 Gelu's types (bfloat16 too, which numpy has no dtype for)
GELU_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64))


@register
class FuseGelu(PatternPass):
    """gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2)))                                   -> Gelu
                 x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))           -> Gelu(approximate="tanh")

        x ─┬─ Div(sqrt 2) ── Erf ── Add(1) ─┐
           └─────────────────────────────── Mul ── Mul(0.5) ── y      =>   x ── Gelu ── y

    The 0.5 outside (torch: (x * gate) * 0.5), on x (HF: (0.5 * x) * gate) or on the gate
    (x * (0.5 * gate)); x / sqrt(2) or x * (1/sqrt(2)); x^3 as Pow(x, 3) or x * (x * x), and
    0.044715 x^3 as x * (x * (0.044715 * x)) (jax2tf); operands in either order. Constants match to
    their dtype's precision (relative 1e-6 in float32): a float16 GELU (model.half()) is one too.
    """

    name = "gelu"
    description = "Fuse a decomposed GELU (Erf or Tanh form) into Gelu"
    label = "decomposed GELU -> Gelu"
    min_opset = 20
    # exactly one 0.5 and one gate, in each place they are written: x * 0.5 * 0.5 is not a GELU
    pattern = Alt(Op("Mul", Op("Mul", X, GATE, name="inner"), HALF, name="outer"),
                  Op("Mul", Op("Mul", X, HALF, name="inner"), GATE, name="outer"),
                  Op("Mul", X, Op("Mul", HALF, GATE, name="inner"), name="outer"))

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        dtype = g.dtype(m.tensor("x"))
        if dtype not in GELU_DTYPES:
            return Decline(f"{m.node('outer').name} computes in {dtype}; Gelu takes {', '.join(map(str, GELU_DTYPES))}")
        return rank_reason(m, g)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        attrs = {"approximate": "tanh"} if "tanh" in m.nodes else {}
        node = g.node("Gelu", [m.tensor("x")], attrs, name=f"{m.node('outer').name}_gelu", outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])
