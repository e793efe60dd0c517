"""GELU-family activations -> onnxruntime's fused kernels: Gelu, FastGelu, QuickGelu, BiasGelu."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, TensorShape
from fuse_cli.match import Alt, Const, Match, Op, Var, any_value, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activations import ERF_GATE, TANH_GATE, X, bias_reason, bias_tensor, decomposed_gelu

MS = "com.microsoft"
# x = input + bias: named "x", the Add's output is the very x the rest of the pattern reads
BIASED_X = Op("Add", Var("input"), Const(any_value, name="bias"), name="x")


def approximated(form: str):
    """A standard Gelu's `approximate` attribute predicate: the form a pass takes ("none" when unset);
    the other form is another function, not a near-miss."""
    return lambda value: _string(value if value is not None else "none") == form


class _Activation(PatternPass):
    """One elementwise activation -> one onnxruntime op, optionally with its input's bias."""

    fused_op: ClassVar[str]

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node | None]:
        return g.dtype(m.tensor("input") if "input" in m.tensors else m.tensor("x")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x = m.tensor("input") if "input" in m.tensors else m.tensor("x")
        dtype, shape = g.dtype(x), g.shape(x)
        if (reason := _rank_reason(m, x, shape)) is not None:
            return reason
        if m.tensor("bias") is None:
            return None
        if shape is None or shape.rank == 0:
            return Decline(f"{x.name!r} has no known last axis for {m.root.name}'s bias")
        return bias_reason(g, m.tensor("bias"), m.node("x" if "x" in m.nodes else "add"), shape, dtype)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        if m.tensor("bias") is None:
            inputs = [m.tensor("x")]
        else:
            inputs = [m.tensor("input"), bias_tensor(g, m.tensor("bias"), g.shape(m.tensor("input")).dims[-1])]
        node = g.node(self.fused_op, inputs, self.attrs(m), name=f"{m.root.name}_{self.fused_op}",
                      outputs=[m.root.outputs[0]], domain="com.microsoft")
        return Replacement(nodes=[node])

    def attrs(self, m: Match) -> dict:
        return {}


@register
class FuseContribGelu(_Activation):
    """gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2)))  -> com.microsoft Gelu, at any opset

        x ─┬─ Div(sqrt 2) ── Erf ── Add(1) ─┐
           └─────────────────────────────── Mul ── Mul(0.5) ── y      =>   x ── Gelu ── y

    The forms gelu matches (which needs opset 20), and a standard Gelu (approximate="none").
    """

    name = "contrib-gelu"
    description = "Fuse an Erf GELU (or a standard Gelu) into onnxruntime's Gelu"
    label = "Erf GELU -> com.microsoft Gelu"
    fused_op = "Gelu"
    emits = ("com.microsoft::Gelu",)
    pattern = Alt(decomposed_gelu(ERF_GATE), Op("Gelu", X, name="gelu", approximate=approximated("none")))


@register
class FuseFastGelu(_Activation):
    """y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),  x = input (+ bias)  -> FastGelu

        input ── Add(bias) = x ─┬─ (x + 0.044715 x^3) ── Mul(sqrt(2/pi)) ── Tanh ── Add(1) ─┐
                                └──────────────────────────────────────────────────────── Mul ── Mul(0.5)
          =>  input ── FastGelu(bias?) ── y

    x^3 as Pow(x, 3) or x * (x * x); or a standard Gelu(approximate="tanh"). A constant bias over
    the last axis only is absorbed as FastGelu's 1-D bias input.
    """

    name = "fast-gelu"
    description = "Fuse a tanh GELU (and the bias Add before it) into onnxruntime's FastGelu"
    label = "tanh GELU (+ bias) -> FastGelu"
    fused_op = "FastGelu"
    emits = ("com.microsoft::FastGelu",)
    pattern = Alt(decomposed_gelu(TANH_GATE, Alt(BIASED_X, X)),
                  Op("Gelu", Alt(BIASED_X, X), name="gelu", approximate=approximated("tanh")))


@register
class FuseQuickGelu(_Activation):
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


@register
class FuseBiasGelu(_Activation):
    """y = gelu(input + bias), bias a constant over the last axis  -> BiasGelu(input, bias)

        input ── Add(bias) ── Gelu ── y      =>   input ── BiasGelu(bias) ── y

    Gelu is onnxruntime's (contrib-gelu's output) or the standard one with approximate="none".
    Runs before matmul-add, which would otherwise take a rank-2 MatMul's Add into a Gemm.
    Declined where the model may run on the CPU provider (ort, ort-cpu): its kernel there is
    slower than the two nodes it replaces (targets.SLOWER).
    """

    name = "bias-gelu"
    description = "Fuse a bias Add and Gelu into onnxruntime's BiasGelu (declined where the CPU runs it: slower)"
    label = "Add (bias) + Gelu -> BiasGelu"
    fused_op = "BiasGelu"
    emits = ("com.microsoft::BiasGelu",)
    pattern = Alt(Op("Gelu", Op("Add", Var("input"), Var("bias", const=True), name="add"), name="gelu", domain=MS),
                  Op("Gelu", Op("Add", Var("input"), Var("bias", const=True), name="add"), name="gelu",
                     approximate=approximated("none")))

    def matches(self, m: Match, g: GraphEditor) -> bool:
        # Add(bias, x) is also tried as input=bias, bias=x: no candidate, and its near-miss ("x is
        # computed at run time") would hide the real one of the other ordering.
        return constant_value(m.tensor("input")) is None or constant_value(m.tensor("bias")) is not None

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        # the engine asks before check: on the CPU no other condition matters, and each ordering
        # of the Add's operands then gives the same reason
        return super().emitted_at(m, g)[0], m.node("gelu")


def _rank_reason(m: Match, x: gs.Tensor, shape: TensorShape | None) -> Decline | None:
    """A one-element constant of higher rank than x broadcasts it up (0.5 of shape [1,1,1] makes
    an [N] x [1,1,N]); the fused op keeps x's shape, so that is not exact."""
    for node in m.covered:
        for t in node.inputs:
            value = constant_value(t)
            if value is None or t is m.tensor("bias") or not value.ndim or (shape and value.ndim <= shape.rank):
                continue
            rank = shape.rank if shape else "unknown rank"
            return Decline(f"{node.name}'s constant {t.name!r} has rank {value.ndim}, more than {x.name!r}'s {rank}")
    return None


def _string(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
