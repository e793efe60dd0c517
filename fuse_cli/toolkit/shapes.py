"""Shape proofs: which dims a shape vector reads (through Shape, Gather, Slice, Concat), when two
dims are provably equal, and when a constant broadcasts a result to a higher rank."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, TensorShape
from fuse_cli.match import Alt, Match, Op, Var, constant_value, match_root
from fuse_cli.pipeline.base import Decline

SHAPE = Op("Shape", Var("source"), name="shape_of")  # opset 15 adds start/end attributes
GATHER = Op("Gather", SHAPE, Var("index"), name="gather")
# A piece of a shape vector that reads dims of `source`: a scalar Gather made 1-D, a Gather of
# several indices, a Slice (inputs from opset 10, attributes before) or the whole Shape.
DIMS = Alt(Op(("Unsqueeze", "Reshape"), GATHER, Var("axes", optional=True)), GATHER,
           Op("Slice", SHAPE, *(Var(v, optional=True) for v in ("starts", "ends", "slice_axes", "steps")),
              name="slice"),
           SHAPE)
Entry = int | tuple[gs.Tensor, int] | None  # a constant, dim `axis` of a tensor, or unknown
def shape_entries(shape: gs.Tensor, g: GraphEditor) -> list[Entry] | None:
    """A shape vector's values as entries (constants, or dim `axis` of a tensor read through
    Shape), when it is a constant or a Concat of such pieces; None where a piece's length is unknown."""
    entries: list[Entry] = []
    for piece in shape_pieces(shape):
        part = piece_entries(piece, g)
        if part is None:
            return None
        entries += part
    return entries


def shape_pieces(shape: gs.Tensor) -> list[gs.Tensor]:
    producer = shape.inputs[0] if len(shape.inputs) == 1 else None
    return list(producer.inputs) if producer is not None and producer.op == "Concat" else [shape]


def piece_dims(piece: gs.Tensor) -> Match | None:
    producer = piece.inputs[0] if len(piece.inputs) == 1 else None
    return next(match_root(DIMS, producer), None) if producer is not None else None


def piece_entries(piece: gs.Tensor, g: GraphEditor) -> list[Entry] | None:
    """The piece's values as entries; None when even its length is unknown."""
    value = constant_value(piece)
    if value is not None:
        return [int(v) for v in value.reshape(-1)]
    m = piece_dims(piece)
    axes = axes_read(m, g) if m is not None else None
    if axes is not None:
        return [(m.tensor("source"), axis) for axis in axes]
    shape = g.shape(piece)
    length = shape.static(0) if shape is not None and shape.rank == 1 else None
    return None if length is None else [None] * length


def axes_read(m: Match, g: GraphEditor) -> list[int] | None:
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



def same_dim(a, b) -> bool:
    """Provably equal dims: the same static size or the same symbolic name."""
    return a is not None and a == b


def rank_reason(m: Match, g: GraphEditor) -> Decline | None:
    """None unless a constant in the match has more dims than x: it broadcasts the result to a
    higher rank than the fused operator, whose output has x's shape, would give."""
    x = m.tensor("x")
    shape = g.shape(x)
    for node in m.covered:
        for t in node.inputs:
            value = constant_value(t)
            if value is not None and value.ndim > (shape.rank if shape is not None else 1):
                return (Decline(f"{node.name}'s constant {t.name!r} of shape {list(value.shape)} broadcasts "
                        f"{x.name!r} (rank {shape.rank if shape is not None else 'unknown'}) to rank {value.ndim}"))
    return None


def dims_list(shape: TensorShape | None) -> list | None:
    return list(shape.dims) if shape is not None else None


def reads_a_shape(piece: gs.Tensor, limit: int = 8) -> bool:
    """The piece is dims read from a Shape, or computed from a Shape within `limit` nodes."""
    if piece_dims(piece):
        return True
    todo, seen = [piece], 0
    while todo and seen < limit:
        t = todo.pop()
        if isinstance(t, gs.Constant) or len(t.inputs) != 1:
            continue
        node, seen = t.inputs[0], seen + 1
        if node.op == "Shape":
            return True
        todo += [i for i in node.inputs if isinstance(i, gs.Variable)]
    return False


def minus_one_resolved(shape: list[int], x_dims, allowzero: int) -> list[int]:
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
