"""Concat inputs that are provably empty along the concatenated axis add nothing: drop them."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, variadic
from fuse_cli.pipeline.base import PatternPass, Requirement
from fuse_cli.pipeline.registry import register

def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Some input of the Concat is empty along its axis, and not all of them."""
    concat = m.node("concat")
    empty = [_empty(t, concat, g) for t in concat.inputs]
    return any(empty) and not all(empty)


@register
class EliminateEmptyConcatInputs(PatternPass):
    """a [.., n, ..] ──┐
       e [.., 0, ..] ──┼── Concat(axis) ── y   =>   a, b ── Concat(axis) ── y
       b [.., m, ..] ──┘

    An input whose static size along the axis is 0 contributes no element, so y is the same
    without it, bit for bit (eliminate-noop-layout then removes a Concat left with one input).
    transformers' partial-rotary code (Phi-3) leaves Concat(rotated, x[..., rotary_dim:]) with a
    rotary_dim that is the whole head: the pass-through Slice is empty and hides the rotated query
    from the attention patterns. Only a 0 that shape inference proves (a static dim); a symbolic
    dim is never taken as 0, and an input that is empty on another axis only is left alone. At
    least one input stays, so y keeps its dtype and rank.
    """

    name = "eliminate-empty-concat-inputs"
    description = "Drop Concat inputs whose size along the concatenated axis is a static 0"
    label = "Concat of an empty input"
    pattern = variadic("Concat", "concat")

    requires = (Requirement(
        "Some input of the Concat is empty along its axis, and not all of them.",
        _is_this_pattern),)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        concat = m.node("concat")
        inputs = [t for t in concat.inputs if not _empty(t, concat, g)]
        node = g.node("Concat", inputs, dict(concat.attrs), name=f"{concat.name}_nonempty", outputs=[concat.outputs[0]])
        return Replacement(nodes=[node])


def _empty(tensor: gs.Tensor, concat: gs.Node, g: GraphEditor) -> bool:
    shape = g.shape(tensor)
    axis = concat.attrs.get("axis")
    if shape is None or axis is None or not -shape.rank <= axis < shape.rank:
        return False
    return shape.static(axis % shape.rank) == 0
