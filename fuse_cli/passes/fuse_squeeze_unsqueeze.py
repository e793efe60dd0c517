"""Squeeze/Unsqueeze pairs over the same axes cancel."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


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
    pattern = Alt(*(Op(outer, Op(inner, Var("x"), Var("inner_axes", optional=True), name="inner"),
                       Var("outer_axes", optional=True), name="outer")
                    for inner, outer in (("Unsqueeze", "Squeeze"), ("Squeeze", "Unsqueeze"))))

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        inner, outer = m.node("inner"), m.node("outer")
        axes = [_axes(node, m.tensor(role), g) for node, role in ((inner, "inner_axes"), (outer, "outer_axes"))]
        reason = next((a for a in axes if isinstance(a, Decline)), None)
        if reason:
            return reason
        if axes[0] != axes[1]:
            return Decline(f"{inner.name} and {outer.name} act on different axes ({sorted(axes[0])} vs "
                           f"{sorted(axes[1])})")
        return Decline.unless(g.reroute_reason(outer.outputs[0], m.tensor("x")))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(reroute=[(m.node("outer").outputs[0], m.tensor("x"))])


def _axes(node: gs.Node, axes_input: gs.Tensor | None, g: GraphEditor) -> set[int] | Decline:
    """The node's axes as non-negative positions in the longer (unsqueezed) rank, or why unknown."""
    wide, narrow = (g.shape(t) for t in (node.inputs[0], node.outputs[0])[:: 1 if node.op == "Squeeze" else -1])
    if axes_input is not None:
        axes = constant_value(axes_input)
        if axes is None:
            return Decline(f"{node.name}'s axes {axes_input.name!r} are not a constant")
        axes = axes.reshape(-1).tolist()
    elif "axes" in node.attrs:
        axes = list(node.attrs["axes"])
    elif wide is None or not all(isinstance(d, int) for d in wide.dims):
        return Decline(f"{node.name} squeezes every size-1 dim, and its input's dims are not all static")
    else:
        axes = [i for i, d in enumerate(wide.dims) if d == 1]
    if any(a < 0 for a in axes):
        rank = wide.rank if wide is not None else narrow.rank + len(axes) if narrow is not None else None
        if rank is None:
            return Decline(f"{node.name} has negative axes {axes} and the rank is unknown")
        axes = [a + rank if a < 0 else a for a in axes]
    return set(axes)
