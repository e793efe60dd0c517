"""Rotate-half rotary embeddings: the pattern and the proofs a fusion into a RotaryEmbedding needs
(the Slices take the two halves, cos/sin hold one row per position, or per batch row and position,
with equal halves, Q/K's head split), shared by rotary-embedding (com.microsoft) and
standard-rotary-embedding (opset 23)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, TensorShape
from fuse_cli.match import Match, Op, Var, constant_value, producer_of
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.toolkit.heads import head_split
from fuse_cli.toolkit.shapes import same_dim
from fuse_cli.toolkit.values import INT_MAX, int_value

LAST = lambda axis: axis in (-1, 3)  # noqa: E731


def half(role: str) -> Op:
    return Op("Slice", Var("x"), Var(f"{role}_start"), Var(f"{role}_end"), Var(f"{role}_axes"),
              Var(f"{role}_steps", optional=True), name=role)


ROTATE_HALF = Op("Concat", Op("Neg", half("upper"), name="neg"), half("lower"), name="rotate_half", axis=LAST)
# y = x * cos + rotate_half(x) * sin
ROTARY = Op("Add", Op("Mul", Var("x"), Var("cos"), name="cos_mul"), Op("Mul", ROTATE_HALF, Var("sin"), name="sin_mul"),
            name="rotary")


def rotary_decline(m: Match, g: GraphEditor) -> Decline | None:
    """None when the ROTARY match rotates x [B, H, S, d] (d static, even) by the halves of per-position
    cos/sin tables [1, .., S, d], or per-(batch, position) tables [B, 1, S, d] (cos/sin computed from
    given position_ids [B, S]), whose two halves are provably equal, all of x's dtype."""
    x = g.shape(m.tensor("x"))
    d = x.static(3) if x is not None and x.rank == 4 else None
    if d is None or d % 2:
        return Decline(f"{m.tensor('x').name!r} has shape {x and list(x.dims)}: not [batch, heads, sequence, "
                       f"head_size] with a static even head_size")
    for role, start, end in (("lower", 0, d // 2), ("upper", d // 2, d)):
        if reason := _slice_reason(m, g, role, start, end):
            return Decline(reason)
    for role in ("cos", "sin"):
        if reason := _table_reason(m.tensor(role), g, x, role):
            return Decline(reason)
    if per_batch_row(m.tensor("cos"), g) != per_batch_row(m.tensor("sin"), g):
        return Decline(f"one of cos {m.tensor('cos').name!r} and sin {m.tensor('sin').name!r} holds a row per batch "
                       f"row and position, the other one per position: the kernel reads both by the same ids")
    if g.dtype(m.tensor("cos")) != g.dtype(m.tensor("x")) or g.dtype(m.tensor("sin")) != g.dtype(m.tensor("x")):
        return Decline("cos and sin are not of x's dtype")
    return None


class RotateHalfFusion(PatternPass):
    """The rotate-half match and its proofs (rotary_decline); a subclass writes the rewrite, the
    RotaryEmbedding it emits."""

    pattern = ROTARY

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("x")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return rotary_decline(m, g)


def split_heads(x: gs.Tensor, g: GraphEditor) -> tuple[gs.Tensor, int, gs.Node, gs.Node] | None:
    """(x3, H, Reshape, Transpose) when x = Transpose[0,2,1,3](Reshape(x3 [B, S, H*d]) to [B, S, H, d])."""
    transpose = producer_of(x)
    if transpose is None or transpose.op != "Transpose" or list(transpose.attrs.get("perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = producer_of(transpose.inputs[0])
    split = head_split(reshape, g) if reshape is not None and reshape.op == "Reshape" else None
    return None if split is None else (reshape.inputs[0], split[0], reshape, transpose)


def _slice_reason(m: Match, g: GraphEditor, role: str, start: int, end: int) -> str | None:
    """The Slice takes x[..., start:end] on the last axis (an end past d counts as d)."""
    node = m.node(role)
    values = [int_value(m.tensor(f"{role}_{v}"), g) for v in ("start", "end", "axes")]
    steps = m.tensor(f"{role}_steps")
    step = int_value(steps, g) if steps is not None else np.array([1])
    if any(v is None or v.size != 1 for v in (*values, step)):
        return f"{node.name}'s bounds are not known before run time (a constant or static-dim arithmetic is needed)"
    first, last, axis, step = (int(v.reshape(-1)[0]) for v in (*values, step))
    if axis not in (-1, 3) or step != 1 or first != start or not (last == end or end == start * 2 and last >= end
                                                                   or last == INT_MAX and end > start):
        return f"{node.name} slices [{first}:{last}:{step}] of axis {axis}, not [{start}:{end}] of the last axis"
    return None


def per_batch_row(t: gs.Tensor, g: GraphEditor) -> bool:
    """cos/sin of rank 4 whose dim 0 is not 1: one row per (batch, position), [B, 1, S, d], as
    position_ids [B, S] given to the model make them (rotary_decline proved B is x's batch)."""
    shape = g.shape(t)
    return shape.rank == 4 and shape.dims[0] != 1


def _table_reason(t: gs.Tensor, g: GraphEditor, x: TensorShape, role: str) -> str | None:
    """cos/sin broadcast as [1, 1, S, d] or [B, 1, S, d] over x [B, H, S, d], with equal halves."""
    shape = g.shape(t)
    # a leading dim that is neither 1 nor provably x's batch could be 1 at run time and broadcast,
    # so it proves nothing about which row a (batch, position) reads
    batch_ok = shape is not None and shape.rank == 4 and (shape.dims[0] == 1 or same_dim(shape.dims[0], x.dims[0]))
    if shape is None or not 2 <= shape.rank <= 4 or any(dim != 1 for dim in shape.dims[:-2][1 if batch_ok else 0:]):
        return (f"{role} {t.name!r} has shape {shape and list(shape.dims)}: not [1, .., sequence, head_size] nor "
                f"[batch, 1, sequence, head_size] with x's batch")
    if shape.dims[-1] != x.dims[3] or not same_dim(shape.dims[-2], x.dims[2]):
        return (f"{role} {t.name!r} of shape {list(shape.dims)} is not provably one row per position of x "
                f"{list(x.dims)} (its sequence dim must be x's dim 2)")
    if not _equal_halves(t, g):
        return (f"the halves of {role} {t.name!r} are not provably equal (Cos/Sin of Concat(freqs, freqs), or a "
                f"constant): RotaryEmbedding rotates both halves by the first")
    return None


def _equal_halves(t: gs.Tensor, g: GraphEditor) -> bool:
    value = constant_value(t)
    if value is not None:
        first, second = np.split(value, 2, axis=-1)
        return bool(np.array_equal(first, second))
    node = producer_of(t)
    if node is None:
        return False
    if node.op in ("Unsqueeze", "Cast"):
        return _equal_halves(node.inputs[0], g)
    if node.op == "Mul":  # a scalar constant (the attention scaling of scaled RoPE variants) times a table
        table = [i for i in node.inputs if (c := constant_value(i)) is None or c.size != 1]
        return len(table) == 1 and _equal_halves(table[0], g)
    if node.op in ("Cos", "Sin"):
        concat = producer_of(node.inputs[0])
        return (concat is not None and concat.op == "Concat" and len(concat.inputs) == 2
                and concat.inputs[0] is concat.inputs[1] and concat.attrs.get("axis") in (-1, g.shape(t).rank - 1))
    return False


def row_position_ids(table: gs.Tensor, g: GraphEditor, base: str) -> tuple[list[gs.Node], gs.Variable]:
    """com.microsoft RotaryEmbedding's position_ids [B, S] for a cache of per-(batch, position) rows:
    the first halves of cos/sin `table` [B, 1, S, d] flattened to [B*S, d/2] hold (b, s)'s row at
    b*S + s, so ids = Range(0, B) * S as a column [B, 1] + Range(0, S). (Built from sums, not by
    reshaping Range(0, B*S) to a run-time [B, S]: every Reshape here has a constant shape.)"""
    shape = g.variable(f"{base}_rows_shape")
    batch, sequence, rows = (g.variable(f"{base}_{role}") for role in ("batch", "sequence", "rows"))
    starts, column, offsets = (g.variable(f"{base}_{role}") for role in ("row_starts", "row_column", "row_offsets"))
    ids = g.variable(f"{base}_position_ids")
    ids.dtype, ids.shape = np.int64, [g.shape(table).dims[0], g.shape(table).dims[2]]

    def scalar(role: str, value: int) -> gs.Constant:
        return g.constant(f"{base}_{role}", np.array(value, np.int64))

    def node(op: str, inputs: list[gs.Tensor], out: gs.Variable, **attrs) -> gs.Node:
        return gs.Node(op, g.unique_name(out.name), attrs, inputs, [out])

    return [
        node("Shape", [table], shape),
        node("Gather", [shape, scalar("batch_axis", 0)], batch, axis=0),
        node("Gather", [shape, scalar("sequence_axis", 2)], sequence, axis=0),
        node("Range", [scalar("zero", 0), batch, scalar("one", 1)], rows),
        node("Mul", [rows, sequence], starts),
        node("Reshape", [starts, g.constant(f"{base}_column", np.array([-1, 1], np.int64))], column),
        node("Range", [scalar("zero", 0), sequence, scalar("one", 1)], offsets),
        node("Add", [column, offsets], ids),
    ], ids
