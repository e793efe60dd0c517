"""The GELU family's shared pass: one elementwise activation -> one onnxruntime operator,
optionally with its input's bias (contrib-gelu, fast-gelu, quick-gelu, bias-gelu)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, TensorShape
from fuse_cli.match import Const, Match, Op, Var, any_value, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.toolkit.activations import bias_reason, bias_tensor

MS = "com.microsoft"
# x = input + bias: named "x", the Add's output is the very x the rest of the pattern reads
BIASED_X = Op("Add", Var("input"), Const(any_value, name="bias"), name="x")


def approximated(form: str):
    """A standard Gelu's `approximate` attribute predicate: the form a pass takes ("none" when unset);
    the other form is another function, not a near-miss."""
    return lambda value: _string(value if value is not None else "none") == form


class ActivationPass(PatternPass):
    """One elementwise activation -> one onnxruntime op, optionally with its input's bias."""

    fused_op: ClassVar[str]

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node | None]:
        return g.dtype(m.tensor("input") if "input" in m.tensors else m.tensor("x")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x = m.tensor("input") if "input" in m.tensors else m.tensor("x")
        dtype, shape = g.dtype(x), g.shape(x)
        if (reason := rank_reason(m, x, shape)) is not None:
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


def rank_reason(m: Match, x: gs.Tensor, shape: TensorShape | None) -> Decline | None:
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
