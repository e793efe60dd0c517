"""Reshape plumbing: Reshape chains collapse, no-op Reshapes go, Squeeze/Unsqueeze pairs cancel."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.passes.base import PatternPass
from fuse_cli.passes.registry import register


@register
class FuseReshapes(PatternPass):
    """x ── Reshape(s1) ── t ── Reshape(s2) ── y   =>   x ── Reshape(s2') ── y
       x ── Reshape(s) ── y  with y's shape = x's shape   =>   readers of y read x

    A Reshape keeps the element order, so only the last target shape matters, except where s2
    has a 0 that (allowzero=0) copies t's dim i: s2'[i] is then t's dim i when it is static, or
    stays 0 when s1[i] is itself a 0 copying x's dim i. A -1 is inferred from the element count,
    which t and x share. A single Reshape is a no-op when every entry of s is x's static dim, a
    copying 0, or the one -1 left over.
    """

    name = "fuse-reshapes"
    description = "Collapse Reshape chains into one Reshape and remove no-op Reshapes"
    label = "Reshape + Reshape / no-op Reshape"
    pattern = Op("Reshape", Alt(Op("Reshape", Var("x"), Var("first_shape"), name="first"), Var("x")),
                 Const(lambda v: v.ndim == 1, name="shape"), name="reshape")

    def matches(self, m: Match, g: GraphEditor) -> bool:
        """A lone Reshape is this pattern only when it provably keeps the shape (most Reshapes
        change it, and saying so for each would drown the real near-misses)."""
        if "first" in m.nodes:
            return True
        reshape, shape = m.node("reshape"), constant_value(m.tensor("shape"))
        dims = g.shape(m.tensor("x"))
        if dims is None or len(shape) != dims.rank:
            return False
        allowzero = reshape.attrs.get("allowzero", 0)
        same = [int(s) == dims.static(i) or (s == 0 and not allowzero) for i, s in enumerate(shape)]
        return same.count(False) <= (1 if -1 in shape.tolist() else 0)

    def check(self, m: Match, g: GraphEditor) -> str | None:
        if "first" in m.nodes:
            merged = _merged_shape(m, g)
            return merged if isinstance(merged, str) else None
        return g.reroute_reason(m.node("reshape").outputs[0], m.tensor("x"))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        reshape = m.node("reshape")
        if "first" not in m.nodes:
            return Replacement(reroute=[(reshape.outputs[0], m.tensor("x"))])
        merged = _merged_shape(m, g)
        shape = m.tensor("shape")
        if not np.array_equal(merged, constant_value(shape)):
            shape = g.constant(f"{reshape.name}_shape", merged)
        fused = gs.Node(op="Reshape", name=reshape.name, attrs=dict(reshape.attrs),
                        inputs=[m.tensor("x"), shape], outputs=[reshape.outputs[0]])
        return Replacement(nodes=[fused])


def _merged_shape(m: Match, g: GraphEditor) -> np.ndarray | str:
    """s2 with every 0 that copies a dim of the intermediate made explicit, or why it cannot be."""
    first, reshape = m.node("first"), m.node("reshape")
    s2 = constant_value(m.tensor("shape")).astype(np.int64)
    if reshape.attrs.get("allowzero", 0) or 0 not in s2:
        return s2
    s1 = constant_value(m.tensor("first_shape"))
    t_dims = g.shape(first.outputs[0])
    merged = s2.copy()
    for i in np.flatnonzero(s2 == 0):
        static = t_dims.static(i) if t_dims is not None and i < t_dims.rank else None
        if static:
            merged[i] = static
        elif s1 is not None and i < s1.size and s1[i] == 0 and not first.attrs.get("allowzero", 0):
            merged[i] = 0  # copies x's dim i, which t's dim i is
        else:
            return (f"{reshape.name}'s shape copies dim {i} of {first.name}'s output (a 0 entry), "
                    "which is not statically known")
    return merged


@register
class CancelSqueezeUnsqueeze(PatternPass):
    """x ── Unsqueeze(a) ── Squeeze(a) ── y   =>   readers of y read x
       x ── Squeeze(a) ── Unsqueeze(a) ── y   =>   readers of y read x

    Unsqueeze inserts size-1 dims at positions a of its output, Squeeze(a) removes exactly those.
    Squeeze then Unsqueeze puts back dims that Squeeze required to be 1. Axes are an attribute
    before opset 13 and an input from 13; negative axes count from the end of the longer of the
    two ranks, which must be known. A Squeeze without axes drops every size-1 dim: its axes are
    then known only when every dim of its input is static.
    """

    name = "fuse-squeeze-unsqueeze"
    description = "Remove Unsqueeze/Squeeze pairs over the same axes"
    label = "Squeeze + Unsqueeze"
    pattern = Op(("Squeeze", "Unsqueeze"), Op(("Squeeze", "Unsqueeze"), Var("x"), Var("inner_axes", optional=True),
                                              name="inner"), Var("outer_axes", optional=True), name="outer")

    def check(self, m: Match, g: GraphEditor) -> str | None:
        inner, outer = m.node("inner"), m.node("outer")
        if inner.op == outer.op:
            return f"{inner.name} and {outer.name} are both {inner.op}: not a Squeeze/Unsqueeze pair"
        axes = [_axes(node, m.tensor(role), g) for node, role in ((inner, "inner_axes"), (outer, "outer_axes"))]
        reason = next((a for a in axes if isinstance(a, str)), None)
        if reason:
            return reason
        if axes[0] != axes[1]:
            return f"{inner.name} and {outer.name} act on different axes ({sorted(axes[0])} vs {sorted(axes[1])})"
        return g.reroute_reason(outer.outputs[0], m.tensor("x"))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(reroute=[(m.node("outer").outputs[0], m.tensor("x"))])


def _axes(node: gs.Node, axes_input: gs.Tensor | None, g: GraphEditor) -> set[int] | str:
    """The node's axes as non-negative positions in the longer (unsqueezed) rank, or why unknown."""
    wide, narrow = (g.shape(t) for t in (node.inputs[0], node.outputs[0])[:: 1 if node.op == "Squeeze" else -1])
    if axes_input is not None:
        axes = constant_value(axes_input)
        if axes is None:
            return f"{node.name}'s axes {axes_input.name!r} are not a constant"
        axes = axes.reshape(-1).tolist()
    elif "axes" in node.attrs:
        axes = list(node.attrs["axes"])
    elif wide is None or not all(isinstance(d, int) for d in wide.dims):
        return f"{node.name} squeezes every size-1 dim, and its input's dims are not all static"
    else:
        axes = [i for i, d in enumerate(wide.dims) if d == 1]
    if any(a < 0 for a in axes):
        rank = wide.rank if wide is not None else narrow.rank + len(axes) if narrow is not None else None
        if rank is None:
            return f"{node.name} has negative axes {axes} and the rank is unknown"
        axes = [a + rank if a < 0 else a for a in axes]
    return set(axes)
