"""x * Sigmoid(alpha * x) -> onnxruntime's QuickGelu."""

from __future__ import annotations

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activation_pass import ActivationPass
from fuse_cli.toolkit.activations import X


@register
class FuseQuickGelu(ActivationPass):
    """y = x * sigmoid(alpha * x)   (alpha = 1.702: QuickGELU; alpha = 1: SiLU/Swish)

        x ─┬─ Mul(alpha)? ── Sigmoid ─┐
           └───────────────────────── Mul ── y      =>   x ── QuickGelu(alpha) ── y

    Exact for any alpha that is a one-element constant (QuickGelu's alpha attribute).
    """

    name = "quick-gelu"
    description = "Fuse x * Sigmoid(alpha * x) into onnxruntime's QuickGelu"
    label = "x * Sigmoid(alpha * x) -> QuickGelu"
    fused_op = "QuickGelu"
    emits = ("com.microsoft::QuickGelu",)
    pattern = Op("Mul", X, Op("Sigmoid", Alt(Op("Mul", X, Var("alpha", const=True), name="scale"), X)),
                 name="mul")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        alpha = m.tensor("alpha")
        if alpha is not None and constant_value(alpha).size != 1:
            shape = list(constant_value(alpha).shape)
            return Decline(f"{m.node('scale').name} scales by {alpha.name!r} of shape {shape}, not one alpha")
        return super().check(m, g)

    def attrs(self, m: Match) -> dict:
        alpha = m.tensor("alpha")
        return {"alpha": float(constant_value(alpha).reshape(-1)[0]) if alpha is not None else 1.0}
