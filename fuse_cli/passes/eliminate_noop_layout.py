"""Layout operators that return their input unchanged: one-input Concat, Tile by ones, Pad by
zeros, Slice over everything, Expand to the shape x already has, Reshape to x's own shape."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.runtime_shapes import is_unnamed_view
from fuse_cli.toolkit.shapes import same_dim

# An end at least this large means "to the end" whatever the dim (torch writes INT64_MAX).
TO_THE_END = 2**31 - 1


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Only the forms that keep x: any other Tile, Pad, Slice or Expand is not this pattern."""
    node = m.node("op")
    return {"Concat": lambda: True, "Tile": lambda: _all(m, "repeats", 1), "Pad": lambda: _pads_zero(m),
            "Slice": lambda: _whole_slice(m, g), "Expand": lambda: _expand_keeps(m, g),
            "Reshape": lambda: _reshape_keeps(m, g) and not is_unnamed_view(node)}[node.op]()


@register
class EliminateNoopLayout(PatternPass):
    """x ── Concat(x) ── y                           (one input)
       x ── Tile(1, ..., 1) ── y
       x ── Pad(0, ..., 0) ── y                      (any mode)
       x ── Slice(0 .. end, step 1 on every axis) ── y
       x ── Expand(s) ── y                           (s broadcasts to x's own shape)
       x ── Reshape(s) ── y                          (y's shape is provably x's)
         =>   readers of y read x

    Each returns x bit for bit. Slice is whole when, on every sliced axis, the step is 1, the
    start is 0 (or at most -dim) and the end is at least the dim (or INT_MAX-sized, for any dim).
    Expand keeps x when every entry of s is 1 or x's static dim there and s has no more dims than
    x. Constants only; a dim that is symbolic counts as unknown, never as 1. Reshape keeps x when
    shape inference gives y x's rank and, dim by dim, the same static size or the same symbol
    (torch's dynamo views sdpa's [B, H, S, d] output as [B, -1, S, d] with sizes read at run time),
    but Reshape(x, Shape(x)): a fused attention's view that keeps the dims unnamed to onnxruntime's
    planner (toolkit.runtime_shapes).
    """

    name = "eliminate-noop-layout"
    description = ("Remove one-input Concat, Tile by ones, Pad by zeros, whole Slice, Expand or Reshape to x's "
                   "own shape")
    label = "no-op Concat/Tile/Pad/Slice/Expand/Reshape"
    pattern = Alt(
        Op("Concat", Var("x"), name="op"),
        Op("Tile", Var("x"), Var("repeats"), name="op"),
        Op("Pad", Var("x"), Var("pads", optional=True), Var("value", optional=True), Var("axes", optional=True),
           name="op"),
        Op("Slice", Var("x"), Var("starts"), Var("ends"), Var("axes", optional=True), Var("steps", optional=True),
           name="op"),
        Op("Slice", Var("x"), name="op"),  # opset < 10: starts/ends/axes attributes
        Op("Expand", Var("x"), Var("shape"), name="op"),
        Op("Reshape", Var("x"), Var("shape"), name="op"),
    )

    requires = (Requirement(
        "Only the forms that keep x: any other Tile, Pad, Slice or Expand is not this pattern.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return Decline.unless(g.reroute_reason(m.node("op").outputs[0], m.tensor("x")))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(reroute=[(m.node("op").outputs[0], m.tensor("x"))])


def _values(m: Match, name: str) -> list | None:
    value = constant_value(m.tensor(name)) if m.tensor(name) is not None else None
    return None if value is None else np.asarray(value).reshape(-1).tolist()


def _all(m: Match, name: str, wanted: int) -> bool:
    values = _values(m, name)
    return values is not None and all(v == wanted for v in values)


def _pads_zero(m: Match) -> bool:
    node = m.node("op")
    pads = node.attrs.get("pads") if m.tensor("pads") is None else _values(m, "pads")
    return pads is not None and all(p == 0 for p in pads)


def _whole_slice(m: Match, g: GraphEditor) -> bool:
    node, shape = m.node("op"), g.shape(m.tensor("x"))
    if m.tensor("starts") is None:
        starts, ends, axes, steps = (node.attrs.get(k) for k in ("starts", "ends", "axes", "steps"))
    else:
        starts, ends, axes, steps = (_values(m, k) for k in ("starts", "ends", "axes", "steps"))
        if starts is None or ends is None or (m.tensor("axes") is not None and axes is None) or \
                (m.tensor("steps") is not None and steps is None):
            return False
    if starts is None or ends is None:
        return False
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = None
        if shape is not None and -shape.rank <= axis < shape.rank:
            dim = shape.static(axis)
        if step != 1:
            return False
        if not (start == 0 or (dim is not None and start <= -dim)):
            return False
        if not (end >= TO_THE_END or (dim is not None and end >= dim)):
            return False
    return True


def _expand_keeps(m: Match, g: GraphEditor) -> bool:
    target, shape = _values(m, "shape"), g.shape(m.tensor("x"))
    if target is None or shape is None or len(target) > shape.rank:
        return False
    trailing = shape.dims[shape.rank - len(target):]
    return all(t == 1 or (isinstance(d, int) and t == d) for t, d in zip(target, trailing))


def _reshape_keeps(m: Match, g: GraphEditor) -> bool:
    source, out = g.shape(m.tensor("x")), g.shape(m.node("op").outputs[0])
    return (source is not None and out is not None and source.rank == out.rank
            and all(same_dim(a, b) for a, b in zip(source.dims, out.dims)))
