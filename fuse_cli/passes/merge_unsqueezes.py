"""Two Unsqueezes in a row become one."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement, kept
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class MergeUnsqueezes(PatternPass):
    """x ── Unsqueeze(a) ── Unsqueeze(b) ── y   =>   x ── Unsqueeze(c) ── y

    The first inserts size-1 dims at positions a of its output, the second at positions b of
    the final output; c is where all of them end up in the final output (the first's dims move
    right past each of the second's inserted before them). Negative axes need the rank of x.
    Exact: both compute a reshape of x that only inserts 1s. Axes are an attribute before opset
    13 and a constant input from 13; the merged node uses the model's form. A first Unsqueeze
    read only by Unsqueezes (exporters unsqueeze one range twice for two masks) stays for the
    others until each has merged; then nothing reads it and it goes.
    """

    name = "merge-unsqueezes"
    description = "Merge two consecutive Unsqueezes into one"
    label = "Unsqueeze + Unsqueeze"
    pattern = Op("Unsqueeze", Op("Unsqueeze", Var("x"), Var("inner_axes", optional=True), name="inner"),
                 Var("outer_axes", optional=True), name="outer")
    keeps = ("inner",)  # re-emitted for its other Unsqueeze readers (check allows no other kind)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        inner = m.node("inner")
        others = [r for r in g.outside_readers(inner.outputs[0], m) if r.op != "Unsqueeze"]
        if others or g.is_graph_output(inner.outputs[0]):
            where = "is a graph output" if not others else f"is also read by {others[0].name}"
            return Decline(f"{inner.name}'s output {inner.outputs[0].name!r} {where}")
        merged = _merged_axes(m, g)
        return merged if isinstance(merged, Decline) else None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        outer = m.node("outer")
        axes = np.asarray(_merged_axes(m, g), dtype=np.int64)
        if m.tensor("outer_axes") is not None:
            inputs, attrs = [m.tensor("x"), g.constant(f"{outer.name}_axes", axes)], {}
        else:
            inputs, attrs = [m.tensor("x")], {"axes": axes.tolist()}
        node = g.node("Unsqueeze", inputs, attrs, name=f"{outer.name}_merged", outputs=[outer.outputs[0]])
        inner = m.node("inner")
        if not g.outside_readers(inner.outputs[0], m):
            return Replacement(nodes=[node])
        # the other Unsqueezes still read it: as it was, until they merge too
        return Replacement(nodes=[kept(inner), node])


def _merged_axes(m: Match, g: GraphEditor) -> list[int] | Decline:
    axes = []
    for role in ("inner", "outer"):
        node, given = m.node(role), m.tensor(f"{role}_axes")
        values = constant_value(given) if given is not None else node.attrs.get("axes")
        if values is None:
            return Decline(f"{node.name}'s axes are not a constant")
        axes.append([int(a) for a in np.asarray(values).reshape(-1)])
    inner, outer = axes
    x_shape = g.shape(m.tensor("x"))
    if any(a < 0 for a in inner + outer):
        if x_shape is None:
            return Decline(f"{m.node('inner').name} or {m.node('outer').name} has negative axes and the rank of "
                           f"{m.tensor('x').name!r} is unknown")
    rank = x_shape.rank if x_shape is not None else None
    middle = (rank + len(inner)) if rank is not None else None
    inner = sorted(a + middle if a < 0 else a for a in inner)
    final = (middle + len(outer)) if middle is not None else None
    outer = sorted(a + final if a < 0 else a for a in outer)
    # place markers: the first's output, then the second's insertions into it
    width = (middle if middle is not None else max(inner, default=-1) + 1)
    marks = ["new" if i in inner else "old" for i in range(width)]
    for a in outer:
        marks += ["old"] * (a - len(marks))  # rank unknown: positions past the first's axes are x's dims
        marks.insert(a, "new")
    return [i for i, mark in enumerate(marks) if mark == "new"]
