"""Consecutive Transposes compose into one, or cancel when together they permute nothing."""

from __future__ import annotations

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Match, Op, Var
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class FuseTransposes(PatternPass):
    """x ── Transpose(p1) ── Transpose(p2) ── y   =>   x ── Transpose(q) ── y,   q[j] = p1[p2[j]]

    The first gives t with t.shape[i] = x.shape[p1[i]], the second y.shape[j] = t.shape[p2[j]]
    = x.shape[p1[p2[j]]] (element-wise the same index map). A missing perm reverses the axes;
    the rank it needs is the other perm's length, and two missing perms are the identity at any
    rank. When q is the identity both nodes go and the readers of y read x.
    """

    name = "fuse-transposes"
    description = "Compose consecutive Transposes into one, or remove them when they cancel"
    label = "Transpose + Transpose"
    pattern = Op("Transpose", Op("Transpose", Var("x"), name="first"), name="second")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        first, second = m.node("first"), m.node("second")
        p1, p2 = first.attrs.get("perm"), second.attrs.get("perm")
        if p1 is not None and p2 is not None and len(p1) != len(p2):
            return Decline(f"{first.name} permutes {len(p1)} axes but {second.name} permutes {len(p2)}")
        composed = _compose(p1, p2)
        if composed is None or composed == list(range(len(composed))):
            return Decline.unless(g.reroute_reason(second.outputs[0], m.tensor("x")))
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        first, second = m.node("first"), m.node("second")
        composed = _compose(first.attrs.get("perm"), second.attrs.get("perm"))
        if composed is None or composed == list(range(len(composed))):
            return Replacement(reroute=[(second.outputs[0], m.tensor("x"))])
        fused = rebuilt(second, inputs=[m.tensor("x")], outputs=[second.outputs[0]], attrs={"perm": composed})
        return Replacement(nodes=[fused])


def _compose(p1: list[int] | None, p2: list[int] | None) -> list[int] | None:
    """The single permutation equal to p1 then p2; None when both are missing (the identity)."""
    if p1 is None and p2 is None:
        return None
    rank = len(p1 if p1 is not None else p2)
    reverse = list(range(rank - 1, -1, -1))
    p1 = list(p1) if p1 is not None else reverse
    p2 = list(p2) if p2 is not None else reverse
    return [int(p1[j]) for j in p2]
