"""Reshape plumbing: Reshape chains collapse (a Transpose that moves only size-1 axes is a Reshape
too), no-op Reshapes go."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.runtime_shapes import is_unnamed_view


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """A lone Reshape is this pattern only when it provably keeps the shape (most Reshapes
    change it, and saying so for each would drown the real near-misses)."""
    if "first" in m.nodes:
        return not is_unnamed_view(m.node("first"))
    if "transpose" in m.nodes:
        return _moves_only_unit_axes(m.node("transpose").attrs.get("perm"), g.shape(m.tensor("x")))
    reshape, shape = m.node("reshape"), constant_value(m.tensor("shape"))
    dims = g.shape(m.tensor("x"))
    if dims is None or len(shape) != dims.rank:
        return False
    allowzero = reshape.attrs.get("allowzero", 0)
    same = [int(s) == dims.static(i) or (s == 0 and not allowzero) for i, s in enumerate(shape)]
    return same.count(False) <= (1 if -1 in shape.tolist() else 0)


@register
class FuseReshapes(PatternPass):
    """x ── Reshape(s1) ── t ── Reshape(s2) ── y   =>   x ── Reshape(s2') ── y
       x ── Transpose(p) ── t ── Reshape(s) ── y   =>   x ── Reshape(s) ── y
                                                   (p moves only size-1 axes)
       x ── Reshape(s) ── y  with y's shape = x's shape   =>   readers of y read x

    A Reshape keeps the element order, so only the last target shape matters, except where s2
    has a 0 that (allowzero=0) copies t's dim i: s2'[i] is then t's dim i when it is static, or
    stays 0 when s1[i] is itself a 0 copying x's dim i. A -1 is inferred from the element count,
    which t and x share. A single Reshape is a no-op when every entry of s is x's static dim, a
    copying 0, or the one -1 left over. A first Reshape(x, Shape(x)) stays: a fused attention's
    view that keeps the dims unnamed to onnxruntime's planner (toolkit.runtime_shapes). A
    Transpose whose other axes keep their order moves no element (ConvNeXt's head: [B, 1, 1, C] ->
    [B, C, 1, 1] before a flatten); a symbolic dim counts as not 1. The Reshape's shape must then
    have no 0 that copies a dim of t (t's and x's dims differ in position).
    """

    name = "fuse-reshapes"
    description = "Collapse Reshape chains into one Reshape and remove no-op Reshapes"
    label = "Reshape + Reshape / no-op Reshape"
    pattern = Op("Reshape", Alt(Op("Reshape", Var("x"), Var("first_shape"), name="first"),
                                Op("Transpose", Var("x"), name="transpose"), Var("x")),
                 Const(lambda v: v.ndim == 1, name="shape"), name="reshape")

    requires = (Requirement(
        "A lone Reshape is this pattern only when it provably keeps the shape (most Reshapes change it, and "
        "saying so for each would drown the real near-misses).",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if "transpose" in m.nodes:
            reshape = m.node("reshape")
            if not reshape.attrs.get("allowzero", 0) and 0 in constant_value(m.tensor("shape")).tolist():
                return Decline(f"{reshape.name}'s shape copies a dim of {m.node('transpose').name}'s output "
                               "(a 0 entry), which sits elsewhere in its input")
            return Decline.unless(g.replace_reason(m))
        if "first" in m.nodes:
            merged = _merged_shape(m, g)
            return merged if isinstance(merged, Decline) else None
        return Decline.unless(g.reroute_reason(m.node("reshape").outputs[0], m.tensor("x")))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        reshape = m.node("reshape")
        if "transpose" in m.nodes:
            return Replacement(nodes=[rebuilt(reshape, inputs=[m.tensor("x"), m.tensor("shape")],
                                              outputs=[reshape.outputs[0]])])
        if "first" not in m.nodes:
            return Replacement(reroute=[(reshape.outputs[0], m.tensor("x"))])
        merged = _merged_shape(m, g)
        shape = m.tensor("shape")
        if not np.array_equal(merged, constant_value(shape)):
            shape = g.constant(f"{reshape.name}_shape", merged)
        fused = rebuilt(reshape, inputs=[m.tensor("x"), shape], outputs=[reshape.outputs[0]])
        return Replacement(nodes=[fused])


def _moves_only_unit_axes(perm, shape) -> bool:
    """Does Transpose(perm) of a tensor of `shape` keep every element where it is? True when the
    axes that are not statically 1 keep their order (a symbolic dim may be anything)."""
    if shape is None or perm is None or len(perm) != shape.rank:
        return False
    kept = [axis for axis in perm if shape.static(axis) != 1]
    return kept == sorted(kept)


def _merged_shape(m: Match, g: GraphEditor) -> np.ndarray | Decline:
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
            return (Decline(f"{reshape.name}'s shape copies dim {i} of {first.name}'s output (a 0 entry), "
                    "which is not statically known"))
    return merged
