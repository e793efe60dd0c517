"""Comparisons of a shape vector that are decided before run time, and the Where they select with."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.shapes import shape_entries


def _int_vector(value: np.ndarray) -> bool:
    return value.dtype == np.int64 and value.ndim <= 1


def _all_false(value: np.ndarray) -> bool:
    return value.dtype == np.bool_ and value.ndim <= 1 and not value.any()


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Only comparisons every entry of which is decided, and a Where that keeps s's shape."""
    if "equal" in m.nodes:
        return _decided(m, g) is not None
    shape = g.shape(m.tensor("s"))
    n = shape.static(0) if shape is not None and shape.rank == 1 else None
    sizes = [constant_value(m.tensor("cond")).shape, g.shape(m.tensor("a"))]
    return n is not None and sizes[1] is not None and sizes[1].rank <= 1 and \
        all(size.dims[0] in (1, n) for size in (shape, sizes[1]) if size.rank == 1) and \
        all(d in (1, n) for d in sizes[0])


@register
class FoldShapeComparisons(PatternPass):
    """torch's x.expand(b, -1, n) exports the sizes s through "-1 means keep":

        s ── Equal(-1, ..., -1) ── Where(·, 1, s) ── Expand(x, ·)
          =>  Equal's result is constant where every entry is decided; Where(False, a, s) is s

    An entry of s is a constant (compared as is) or a dim read through Shape, which is never
    negative: equal to a negative constant is False whatever the input shape. Dims compared with
    a non-negative constant are undecided unless static. Where with an all-False constant
    condition returns s exactly, when neither the condition nor `a` broadcasts s to a larger shape.
    """

    name = "fold-shape-comparisons"
    description = "Decide Equal on shape vectors whose dims cannot be negative; drop Where(False, a, s)"
    label = "shape comparison decided before run time"
    pattern = Alt(Op("Equal", Var("s"), Const(_int_vector, name="c"), name="equal"),
                  Op("Where", Const(_all_false, name="cond"), Var("a"), Var("s"), name="where"))

    requires = (Requirement(
        "Only comparisons every entry of which is decided, and a Where that keeps s's shape.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if "where" in m.nodes:
            return Decline.unless(g.reroute_reason(m.node("where").outputs[0], m.tensor("s")))
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        if "where" in m.nodes:
            return Replacement(reroute=[(m.node("where").outputs[0], m.tensor("s"))])
        equal = m.node("equal")
        value = np.asarray(_decided(m, g), dtype=np.bool_)
        return Replacement(nodes=[g.node("Constant", [],
                                         {"value": gs.Constant(g.unique_name(f"{equal.name}_value"), value)},
                                         name=f"{equal.name}_decided", outputs=[equal.outputs[0]])])


def _decided(m: Match, g: GraphEditor) -> list[bool] | None:
    """Entry by entry s == c, or None when any entry is undecided (or s is itself constant:
    constant folding's job)."""
    s = m.tensor("s")
    if constant_value(s) is not None:
        return None
    entries = shape_entries(s, g)
    c = constant_value(m.tensor("c")).reshape(-1).tolist()
    if entries is None or len(c) not in (1, len(entries)):
        return None
    out = []
    for entry, wanted in zip(entries, c * len(entries) if len(c) == 1 else c):
        if isinstance(entry, int):
            out.append(entry == wanted)
        elif entry is not None and wanted < 0:
            out.append(False)  # a dim is never negative
        elif entry is not None and isinstance(g.dim(entry[0], entry[1]), int):
            out.append(g.dim(entry[0], entry[1]) == wanted)
        else:
            return None
    return out
