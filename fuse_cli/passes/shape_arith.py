"""Reshapes whose target shape is computed from Shape at run time -> the same Reshape, shape constant."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, label
from fuse_cli.match import Alt, Match, Op, Var, constant_value, match_root
from fuse_cli.passes.base import PatternPass
from fuse_cli.passes.registry import register

SHAPE = Op("Shape", Var("source"), name="shape_of")  # opset 15 adds start/end attributes
GATHER = Op("Gather", SHAPE, Var("index"), name="gather")
# A piece of a shape vector that reads dims of `source`: a scalar Gather made 1-D, a Gather of
# several indices, a Slice (inputs from opset 10, attributes before) or the whole Shape.
DIMS = Alt(Op(("Unsqueeze", "Reshape"), GATHER, Var("axes", optional=True)), GATHER,
           Op("Slice", SHAPE, *(Var(v, optional=True) for v in ("starts", "ends", "slice_axes", "steps")),
              name="slice"),
           SHAPE)
Entry = int | tuple[gs.Tensor, int] | None  # a constant, dim `axis` of a tensor, or unknown


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
    """

    name = "static-reshape-shape"
    description = "Make Reshape shapes computed from Shape at run time constant (0 copies, one -1)"
    label = "Reshape(Shape arithmetic) -> Reshape(constant)"
    pattern = Op("Reshape", Var("x"), Var("shape"), name="reshape")

    def matches(self, m: Match, g: GraphEditor) -> bool:
        """Only shapes that read some tensor's Shape; other run-time shapes depend on data."""
        shape = m.tensor("shape")
        if constant_value(shape) is not None or not any(_dims_of(piece) for piece in _pieces(shape)):
            return False
        # already as short as it gets (e.g. this pass's own output): nothing to say
        leading = _leading_dims(m, g) if isinstance(_static_shape(m, g), str) else None
        return leading is None or _dead_with(m, g, leading[0]) > 2

    def check(self, m: Match, g: GraphEditor) -> str | None:
        shape = _static_shape(m, g)
        return shape if isinstance(shape, str) and _leading_dims(m, g) is None else None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        reshape = m.node("reshape")
        base = reshape.name or "reshape"
        shape, nodes = _static_shape(m, g), []
        if isinstance(shape, str):  # check passed: the leading-dims form
            t, k, rest = _leading_dims(m, g)
            dims, shape = g.variable(f"{base}_leading_dims"), g.variable(f"{base}_shape")
            dims.dtype = shape.dtype = np.int64
            nodes = [gs.Node(op="Shape", name=g.unique_name(f"{base}_shape_of"), attrs={"start": 0, "end": k},
                             inputs=[t], outputs=[dims]),
                     gs.Node(op="Concat", name=g.unique_name(f"{base}_concat"), attrs={"axis": 0},
                             inputs=[dims, g.constant(f"{base}_rest", np.array(rest, np.int64))], outputs=[shape])]
        else:
            shape = g.constant(f"{base}_shape", shape)
        return Replacement(nodes=nodes + [gs.Node(op="Reshape", name=reshape.name, attrs=dict(reshape.attrs),
                                                  inputs=[m.tensor("x"), shape], outputs=[reshape.outputs[0]])])


def _leading_dims(m: Match, g: GraphEditor) -> tuple[gs.Tensor, int, list[int]] | None:
    """(t, k, constants) when the shape is Concat(dims 0..k-1 of one tensor t, constants), k >= 2."""
    shape = m.tensor("shape")
    if g.opset < 15 or len(shape.inputs) != 1 or shape.inputs[0].op != "Concat":
        return None
    entries = [e for piece in _pieces(shape) for e in (_entries(piece, g) or [None])]
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


def _static_shape(m: Match, g: GraphEditor) -> np.ndarray | str:
    reshape, x = m.node("reshape"), m.tensor("x")
    allowzero = reshape.attrs.get("allowzero", 0)
    x_dims = g.shape(x)
    shape: list[int | None] = []
    unknown: list[str] = []
    for piece in _pieces(m.tensor("shape")):
        entries = _entries(piece, g)
        if entries is None:
            return f"{label(reshape)}'s shape piece {piece.name!r} has a length unknown before run time"
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
        return f"{label(reshape)}'s shape is known only at run time in {'; '.join(unknown)} ({why}{taken})"
    return np.array(_inferred([-1 if s is None else s for s in shape], x_dims, allowzero), np.int64)


def _inferred(shape: list[int], x_dims, allowzero: int) -> list[int]:
    """The -1 made static where x's dims that no 0 copies are all static: numel(x) = copied dims *
    the other entries * the -1, so the -1 is (x's other dims) / (the other entries)."""
    if -1 not in shape or x_dims is None or (allowzero and 0 in shape):
        return shape
    copied = {j for j, s in enumerate(shape) if s == 0 and j < x_dims.rank}
    rest = [d for j, d in enumerate(x_dims.dims) if j not in copied]
    if not all(isinstance(d, int) for d in rest):
        return shape
    total, part = int(np.prod(rest)), int(np.prod([s for s in shape if s > 0]))
    if part == 0 or total % part or total // part == 0:
        return shape
    return [total // part if s == -1 else s for s in shape]


def shape_entries(shape: gs.Tensor, g: GraphEditor) -> list[Entry] | None:
    """A shape vector's values as entries (constants, or dim `axis` of a tensor read through
    Shape), when it is a constant or a Concat of such pieces; None where a piece's length is unknown."""
    entries: list[Entry] = []
    for piece in _pieces(shape):
        part = _entries(piece, g)
        if part is None:
            return None
        entries += part
    return entries


def _pieces(shape: gs.Tensor) -> list[gs.Tensor]:
    producer = shape.inputs[0] if len(shape.inputs) == 1 else None
    return list(producer.inputs) if producer is not None and producer.op == "Concat" else [shape]


def _dims_of(piece: gs.Tensor) -> Match | None:
    producer = piece.inputs[0] if len(piece.inputs) == 1 else None
    return next(match_root(DIMS, producer), None) if producer is not None else None


def _entries(piece: gs.Tensor, g: GraphEditor) -> list[Entry] | None:
    """The piece's values as entries; None when even its length is unknown."""
    value = constant_value(piece)
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    m = _dims_of(piece)
    axes = _axes_read(m, g) if m is not None else None
    if axes is not None:
        return [(m.tensor("source"), axis) for axis in axes]
    shape = g.shape(piece)
    length = shape.static(0) if shape is not None and shape.rank == 1 else None
    return None if length is None else [None] * length


def _axes_read(m: Match, g: GraphEditor) -> list[int] | None:
    """Which dims of `source` the piece reads, in order; None if that needs an unknown rank or value."""
    source = g.shape(m.tensor("source"))
    rank = source.rank if source is not None else None
    if "gather" in m.nodes:
        index = constant_value(m.tensor("index"))
        if index is None or (rank is None and (index < 0).any()):
            return None
        return [int(i) + (rank if i < 0 else 0) for i in index.reshape(-1)]
    if rank is None:
        return None
    shape_of = m.node("shape_of")
    axes = list(range(rank))[shape_of.attrs.get("start", 0):shape_of.attrs.get("end", rank)]
    if "slice" not in m.nodes:
        return axes
    node = m.node("slice")
    if len(node.inputs) == 1:  # Slice-1: starts/ends attributes
        bounds = [node.attrs.get("starts"), node.attrs.get("ends"), [1]]
    else:
        steps = m.tensor("steps")
        bounds = [constant_value(m.tensor("starts")), constant_value(m.tensor("ends")),
                  constant_value(steps) if steps is not None else [1]]
    if any(b is None or np.size(b) != 1 for b in bounds):
        return None
    start, end, step = (int(np.ravel(b)[0]) for b in bounds)
    return axes[start:end:step]  # Python's clamping of out-of-range bounds is ONNX Slice's
