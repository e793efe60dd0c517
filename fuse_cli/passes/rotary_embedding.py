"""Rotary position embedding in the rotate-half form (Llama, Qwen2, Mistral) -> com.microsoft RotaryEmbedding."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value, producer_of
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.heads import head_split
from fuse_cli.toolkit.shapes import same_dim
from fuse_cli.toolkit.values import INT_MAX, int_value

LAST = lambda axis: axis in (-1, 3)  # noqa: E731


def half(role: str) -> Op:
    return Op("Slice", Var("x"), Var(f"{role}_start"), Var(f"{role}_end"), Var(f"{role}_axes"),
              Var(f"{role}_steps", optional=True), name=role)


ROTATE_HALF = Op("Concat", Op("Neg", half("upper"), name="neg"), half("lower"), name="rotate_half", axis=LAST)


@register
class FuseRotaryEmbedding(PatternPass):
    """y = x * cos + rotate_half(x) * sin, rotate_half(x) = Concat(-x[..., d/2:], x[..., :d/2])

      x [B, H, S, d] ─┬──────────────────────────────────────── Mul(cos) ─┐
                      ├ Slice[d/2:] ─ Neg ─┐                              Add ─ y
                      └ Slice[:d/2] ───────┴ Concat(-1) ─────── Mul(sin) ─┘
        =>  RotaryEmbedding(x, position_ids=[0], cos[..., :d/2] as [S, d/2], sin likewise)

    cos and sin broadcast as [1, 1, S, d] (leading dims 1): whatever computed them (Cos/Sin of the
    position ids times inv_freq in the graph, or tensors given) holds one row per position s of
    x, so that row is the cache and position_ids [0] (the kernel reads row start + s) picks it:
    no table of max positions is materialized, and any position ids the graph used stay exact.
    The kernel rotates with the first half of each row only, so the two halves must be provably
    equal: Cos/Sin of Concat(f, f) (times a constant scalar), or a constant checked entrywise.
    Where x is Transpose[0,2,1,3](Reshape(x3) to [B, S, H, d]) (toolkit.heads), the kernel runs on the 3-D x3
    (num_heads H) and the split is redone after it: attention then finds Q and K in their
    projected [B, S, H*d] form. RotaryEmbedding's CPU kernel: float32 and float16.
    """

    name = "rotary-embedding"
    description = "Fuse rotate-half rotary position embedding (x*cos + rotate_half(x)*sin) into RotaryEmbedding"
    label = "rotary embedding -> RotaryEmbedding"
    emits = ("com.microsoft::RotaryEmbedding",)
    pattern = Op("Add", Op("Mul", Var("x"), Var("cos"), name="cos_mul"), Op("Mul", ROTATE_HALF, Var("sin"), name="sin_mul"),
                 name="rotary")

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("x")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x = g.shape(m.tensor("x"))
        d = x.static(3) if x is not None and x.rank == 4 else None
        if d is None or d % 2:
            return Decline(f"{m.tensor('x').name!r} has shape {x and list(x.dims)}: not [batch, heads, sequence, "
                           f"head_size] with a static even head_size")
        for role, start, end in (("lower", 0, d // 2), ("upper", d // 2, d)):
            reason = _slice_reason(m, g, role, start, end)
            if reason:
                return Decline(reason)
        for role in ("cos", "sin"):
            reason = _table_reason(m.tensor(role), g, x, role)
            if reason:
                return Decline(reason)
        if g.dtype(m.tensor("cos")) != g.dtype(m.tensor("x")) or g.dtype(m.tensor("sin")) != g.dtype(m.tensor("x")):
            return Decline("cos and sin are not of x's dtype")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x, base, nodes = m.tensor("x"), m.node("rotary").name, []
        d = g.shape(x).static(3)
        split = _split_heads(x, g)
        caches = []
        for role in ("cos", "sin"):
            first = _node(g, nodes, "Slice", [m.tensor(role), *(g.constant(f"{base}_{v}", np.array([v], np.int64))
                                                                  for v in (0, d // 2, -1))], f"{base}_{role}")
            caches.append(_node(g, nodes, "Reshape", [first, g.constant(f"{base}_cache_shape",
                                                                      np.array([-1, d // 2], np.int64))], f"{base}_{role}"))
        start = g.constant(f"{base}_position_start", np.array([0], np.int64))
        attrs = {"interleaved": 0}
        if split is None:
            nodes.append(gs.Node("RotaryEmbedding", g.unique_name(base), attrs, [x, start, *caches], [m.root.outputs[0]],
                                 domain="com.microsoft"))
            return Replacement(nodes=nodes)
        x3, heads, reshape, transpose = split
        rotated = _node(g, nodes, "RotaryEmbedding", [x3, start, *caches], base, num_heads=heads, rotary_embedding_dim=d,
                        **attrs)
        nodes[-1].domain = "com.microsoft"
        rotated.shape = list(g.shape(x3).dims)  # what later passes of this run read (the tables predate it)
        nodes.append(gs.Node("Reshape", g.unique_name(f"{base}_split"), dict(reshape.attrs), [rotated, reshape.inputs[1]],
                             [split_out := g.variable(f"{base}_split_out", like=x)]))
        split_out.shape = list(g.shape(reshape.outputs[0]).dims)
        nodes.append(gs.Node("Transpose", g.unique_name(f"{base}_heads"), dict(transpose.attrs), [split_out],
                             [m.root.outputs[0]]))
        return Replacement(nodes=nodes)


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


def _table_reason(t: gs.Tensor, g: GraphEditor, x, role: str) -> str | None:
    """cos/sin broadcast as [1, 1, S, d] over x [B, H, S, d], with equal halves."""
    shape = g.shape(t)
    if shape is None or not 2 <= shape.rank <= 4 or any(dim != 1 for dim in shape.dims[:-2]):
        return f"{role} {t.name!r} has shape {shape and list(shape.dims)}: not [1, .., sequence, head_size]"
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


def _split_heads(x: gs.Tensor, g: GraphEditor):
    """(x3, H, Reshape, Transpose) when x = Transpose[0,2,1,3](Reshape(x3 [B, S, H*d]) to [B, S, H, d])."""
    transpose = producer_of(x)
    if transpose is None or transpose.op != "Transpose" or list(transpose.attrs.get("perm", [])) != [0, 2, 1, 3]:
        return None
    reshape = producer_of(transpose.inputs[0])
    split = head_split(reshape, g) if reshape is not None and reshape.op == "Reshape" else None
    return None if split is None else (reshape.inputs[0], split[0], reshape, transpose)


def _node(g: GraphEditor, nodes: list[gs.Node], op: str, inputs: list[gs.Tensor], base: str, **attrs) -> gs.Variable:
    out = g.variable(f"{base}_{op.lower()}_out", like=inputs[0])  # every tensor made here has x's dtype
    nodes.append(gs.Node(op=op, name=g.unique_name(f"{base}_{op.lower()}"), attrs=attrs, inputs=inputs, outputs=[out]))
    return out
