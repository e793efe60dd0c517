"""A Concat of a Concat along the same axis becomes one Concat."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.core.domains import is_default_domain
from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, variadic
from fuse_cli.pipeline.base import PatternPass, Requirement
from fuse_cli.pipeline.registry import register

def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Some input of the outer Concat is an inner Concat on the same axis that only it reads."""
    outer = m.node("outer")
    return any(_inner(t, outer, g) is not None for t in outer.inputs)


@register
class FlattenConcats(PatternPass):
    """a ──────────────────┐
       b ── Concat(axis) ──┼── Concat(axis) ── y   =>   a, b, c, d ── Concat(axis) ── y
       c ──┘           d ──┘

    Concatenation along one axis is associative: the inner Concat's inputs take its place, in
    order. Only an inner Concat on the same axis (negative axes resolved with the rank) whose
    output nothing else reads, so it goes away (Inception's branch outputs, as dynamo exports them).
    """

    name = "flatten-concats"
    description = "Merge a Concat into the Concat on the same axis that alone reads it"
    label = "Concat + Concat"
    pattern = variadic("Concat", "outer")

    requires = (Requirement(
        "Some input of the outer Concat is an inner Concat on the same axis that only it reads.",
        _is_this_pattern),)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        outer = m.node("outer")
        inputs = []
        for tensor in outer.inputs:
            inner = _inner(tensor, outer, g)
            inputs += list(inner.inputs) if inner is not None else [tensor]
        node = g.node("Concat", inputs, dict(outer.attrs), name=f"{outer.name}_flat", outputs=[outer.outputs[0]])
        return Replacement(nodes=[node])


def _inner(tensor: gs.Tensor, outer: gs.Node, g: GraphEditor) -> gs.Node | None:
    """The Concat producing `tensor`, if it concatenates on outer's axis and only outer reads it."""
    inner = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if inner is None or inner.op != "Concat" or not is_default_domain(inner.domain) or g.is_graph_output(tensor):
        return None
    if len(tensor.outputs) != 1 or any(reader is not outer for reader in tensor.outputs):
        return None
    if sum(1 for t in outer.inputs if t is tensor) != 1:
        return None
    return inner if _axis(inner, g) is not None and _axis(inner, g) == _axis(outer, g) else None


def _axis(node: gs.Node, g: GraphEditor) -> int | None:
    axis = node.attrs.get("axis")
    if axis is None or axis >= 0:
        return axis
    shape = g.shape(node.outputs[0])
    return axis + shape.rank if shape is not None else None
