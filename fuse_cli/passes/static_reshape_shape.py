"""Reshapes whose target shape is computed from Shape at run time -> the same Reshape, shape constant."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, label, rebuilt
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.runtime_shapes import is_unnamed_view
from fuse_cli.toolkit.shapes import minus_one_resolved, piece_entries, reads_a_shape, shape_pieces


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Only shapes that read some tensor's Shape (directly, or through arithmetic: MobileViT's
    unfold is [B * C * h, ph, w, pw]); other run-time shapes depend on data."""
    shape = m.tensor("shape")
    if (constant_value(shape) is not None or not any(reads_a_shape(piece) for piece in shape_pieces(shape))
            or is_unnamed_view(m.node("reshape"))):
        return False
    # already as short as it gets (e.g. this pass's own output): nothing to say
    leading = _leading_dims(m, g) if isinstance(_static_shape(m, g), Decline) else None
    return leading is None or _dead_with(m, g, leading[0]) > 2


@register
class StaticReshapeShape(PatternPass):
    """Reshape(x, Concat(pieces)) with pieces read from Shape  =>  Reshape(x, constant)

      t ─ Shape ─ Gather(0) ─ Unsqueeze ─┐
      t ─ Shape ─ Gather(1) ─ Unsqueeze ─┤
                             [H, d] ─────┴ Concat ─┐
      x ───────────────────────────────────────── Reshape ─ y   =>   x ─ Reshape[0, 0, H, d] ─ y

    Each entry j of the shape is a constant, dim i of some tensor t (Gather/Slice of Shape(t),
    Shape(t, start, end)), or a value of known length computed otherwise. Dim i of t becomes its
    static size when shape inference knows it; else 0 when that dim is provably x's dim j (t is x
    and i == j, or both carry the same symbolic name): with allowzero=0 a 0 copies x's dim j. One
    entry still unknown becomes -1: the element count, which Reshape keeps, fixes it to the value
    it had (unless another entry is 0 at run time, an empty tensor). A -1 (given or left) becomes
    static when x's dims that no 0 copies are static: [0, 0, -1, 64] of [B, S, 768] is
    [0, 0, 12, 64], the form head-count readers (attention) need. The Shape chain is then dead;
    cleanup (fold-constants at the start of the next round, and the final one) removes it.

    A shape that stays run-time but is dims 0..k-1 of one tensor t (k >= 2) then constants (torch's
    Conv1D back-reshape, Reshape(Gemm(Reshape(t, [-1, K])), [t.size(0), t.size(1), N]), where a 0
    would copy the 2-D Gemm output's dims) becomes Concat(Shape(t, end=k), constants): the same
    values in 2 nodes (opset >= 15), done only when more than 2 nodes of the old chain die with it.

    Reshape(x, Shape(x)) is left alone: a fused attention's view that keeps dims unnamed to
    onnxruntime's planner (toolkit.runtime_shapes), which a constant shape would name again.
    """

    name = "static-reshape-shape"
    description = "Make Reshape shapes computed from Shape at run time constant (0 copies, one -1)"
    label = "Reshape(Shape arithmetic) -> Reshape(constant)"
    pattern = Op("Reshape", Var("x"), Var("shape"), name="reshape")

    requires = (Requirement(
        "Only shapes that read some tensor's Shape (directly, or through arithmetic: MobileViT's unfold is [B "
        "* C * h, ph, w, pw]); other run-time shapes depend on data.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        shape = _static_shape(m, g)
        return shape if isinstance(shape, Decline) and _leading_dims(m, g) is None else None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        reshape = m.node("reshape")
        base = reshape.name or "reshape"
        shape, nodes = _static_shape(m, g), []
        if isinstance(shape, Decline):  # check passed: the leading-dims form
            t, k, rest = _leading_dims(m, g)
            dims, shape = g.variable(f"{base}_leading_dims"), g.variable(f"{base}_shape")
            dims.dtype = shape.dtype = np.int64
            nodes = [g.node("Shape", [t], {"start": 0, "end": k}, name=f"{base}_shape_of", outputs=[dims]),
                     g.node("Concat", [dims, g.constant(f"{base}_rest", np.array(rest, np.int64))], {"axis": 0},
                            name=f"{base}_concat", outputs=[shape])]
        else:
            shape = g.constant(f"{base}_shape", shape)
        return Replacement(nodes=nodes + [rebuilt(reshape, inputs=[m.tensor("x"), shape],
                                                  outputs=[reshape.outputs[0]])])


def _leading_dims(m: Match, g: GraphEditor) -> tuple[gs.Tensor, int, list[int]] | None:
    """(t, k, constants) when the shape is Concat(dims 0..k-1 of one tensor t, constants), k >= 2."""
    shape = m.tensor("shape")
    if g.opset < 15 or len(shape.inputs) != 1 or shape.inputs[0].op != "Concat":
        return None
    entries = [e for piece in shape_pieces(shape) for e in (piece_entries(piece, g) or [None])]
    k = next((j for j, e in enumerate(entries) if not isinstance(e, tuple)), len(entries))
    rest = entries[k:]
    if k < 2 or not rest or not all(isinstance(e, int) for e in rest):
        return None
    t = entries[0][0]
    if any(e[0] is not t or e[1] != j for j, e in enumerate(entries[:k])):
        return None
    return t, k, rest


def _dead_with(m: Match, g: GraphEditor, source: gs.Tensor) -> int:
    """How many nodes computing the shape nobody reads once the Reshape reads Shape(source)."""
    chain, todo = {}, [m.tensor("shape")]
    while todo:  # the nodes between source and the shape
        t = todo.pop()
        if t is not source and len(t.inputs) == 1 and id(t.inputs[0]) not in chain:
            chain[id(t.inputs[0])] = t.inputs[0]
            todo.extend(t.inputs[0].inputs)
    dead, changed = {id(m.node("reshape"))}, True
    while changed:
        changed = False
        for key, node in chain.items():
            if key not in dead and all(not g.is_graph_output(t) and all(id(r) in dead for r in t.outputs)
                                       for t in node.outputs):
                dead.add(key)
                changed = True
    return len(dead) - 1


def _static_shape(m: Match, g: GraphEditor) -> np.ndarray | Decline:
    reshape, x = m.node("reshape"), m.tensor("x")
    allowzero = reshape.attrs.get("allowzero", 0)
    x_dims = g.shape(x)
    shape: list[int | None] = []
    unknown: list[str] = []
    for piece in shape_pieces(m.tensor("shape")):
        entries = piece_entries(piece, g)
        if entries is None:
            return Decline(f"{label(reshape)}'s shape piece {piece.name!r} has a length unknown before run time")
        for entry in entries:
            j = len(shape)
            if isinstance(entry, tuple):
                t, i = entry
                dim, x_dim = g.dim(t, i), g.dim(x, j)
                if isinstance(dim, int) and (dim or allowzero):
                    entry = dim
                elif not allowzero and ((t is x and i == j) or (isinstance(dim, str) and dim == x_dim)):
                    entry = 0
                else:
                    entry = None
                    unknown.append(f"entry {j} (dim {i} of {t.name!r}, {dim!r}, is not provably "
                                   f"{x.name!r}'s dim {j}, {x_dim!r})")
            elif entry is None:
                made = f"computed by {label(piece.inputs[0])}" if piece.inputs else "a graph input"
                unknown.append(f"entry {j} ({piece.name!r}, {made})")
            shape.append(entry)
    if len(unknown) > 1 or (unknown and -1 in shape):
        why = "allowzero=1, so 0 cannot copy a dim; " if allowzero else ""
        taken = "the shape already has a -1" if -1 in shape else "at most one can be left to -1"
        return Decline(f"{label(reshape)}'s shape is known only at run time in {'; '.join(unknown)} ({why}{taken})")
    return np.array(minus_one_resolved([-1 if s is None else s for s in shape], x_dims, allowzero), np.int64)
