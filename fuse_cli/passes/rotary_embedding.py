"""Rotary position embedding in the rotate-half form (Llama, Qwen2, Mistral) -> com.microsoft RotaryEmbedding.
The pattern and its proofs are toolkit.rotary's, which standard-rotary-embedding shares."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match
from fuse_cli.pipeline.base import Decline
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.rotary import RotateHalfFusion, per_batch_row, row_position_ids, split_heads


@register
class FuseRotaryEmbedding(RotateHalfFusion):
    """y = x * cos + rotate_half(x) * sin, rotate_half(x) = Concat(-x[..., d/2:], x[..., :d/2])

      x [B, H, S, d] ─┬──────────────────────────────────────── Mul(cos) ─┐
                      ├ Slice[d/2:] ─ Neg ─┐                              Add ─ y
                      └ Slice[:d/2] ───────┴ Concat(-1) ─────── Mul(sin) ─┘
        =>  RotaryEmbedding(x, position_ids=[0], cos[..., :d/2] as [S, d/2], sin likewise)
            (cos [B, 1, S, d] from given position_ids: position_ids=b*S + s, caches [B*S, d/2])

    cos and sin broadcast as [1, 1, S, d] (leading dims 1): whatever computed them (Cos/Sin of the
    position ids times inv_freq in the graph, or tensors given) holds one row per position s of
    x, so that row is the cache and position_ids [0] (the kernel reads row start + s) picks it:
    no table of max positions is materialized, and any position ids the graph used stay exact.
    cos and sin computed from position_ids given to the model ([B, 1, S, d], a decode step's form)
    hold one row per (batch, position): flattened to [B*S, d/2], row b*S + s is (b, s)'s, so
    position_ids[b, s] = b*S + s (toolkit.rotary.row_position_ids).
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

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if (reason := super().check(m, g)) is None and per_batch_row(m.tensor("cos"), g) and g.opset < 11:
            return Decline(f"the row ids for cos {m.tensor('cos').name!r} [batch, 1, sequence, head_size] need "
                           f"Range (opset 11); the model is opset {g.opset}")
        return reason

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x, base, nodes = m.tensor("x"), m.node("rotary").name, []
        d = g.shape(x).static(3)
        split = split_heads(x, g)
        caches = []
        for role in ("cos", "sin"):
            first = _node(g, nodes, "Slice", [m.tensor(role), *(g.constant(f"{base}_{v}", np.array([v], np.int64))
                                                                  for v in (0, d // 2, -1))], f"{base}_{role}")
            caches.append(_node(g, nodes, "Reshape", [first, g.constant(f"{base}_cache_shape",
                                                                      np.array([-1, d // 2], np.int64))],
                                f"{base}_{role}"))
        if per_batch_row(m.tensor("cos"), g):  # rotary_decline proved sin of the same [B, 1, S, d] form
            id_nodes, start = row_position_ids(m.tensor("cos"), g, base)
            nodes += id_nodes
        else:
            start = g.constant(f"{base}_position_start", np.array([0], np.int64))
        attrs = {"interleaved": 0}
        if split is None:
            nodes.append(gs.Node("RotaryEmbedding", g.unique_name(base), attrs, [x, start, *caches],
                                 [m.root.outputs[0]],
                                 domain="com.microsoft"))
            return Replacement(nodes=nodes)
        x3, heads, reshape, transpose = split
        rotated = _node(g, nodes, "RotaryEmbedding", [x3, start, *caches], base, num_heads=heads,
                        rotary_embedding_dim=d,
                        **attrs)
        nodes[-1].domain = "com.microsoft"
        rotated.shape = list(g.shape(x3).dims)  # what later passes of this run read (the tables predate it)
        nodes.append(gs.Node("Reshape", g.unique_name(f"{base}_split"), dict(reshape.attrs),
                             [rotated, reshape.inputs[1]],
                             [split_out := g.variable(f"{base}_split_out", like=x)]))
        split_out.shape = list(g.shape(reshape.outputs[0]).dims)
        nodes.append(gs.Node("Transpose", g.unique_name(f"{base}_heads"), dict(transpose.attrs), [split_out],
                             [m.root.outputs[0]]))
        return Replacement(nodes=nodes)


def _node(g: GraphEditor, nodes: list[gs.Node], op: str, inputs: list[gs.Tensor], base: str, **attrs) -> gs.Variable:
    out = g.variable(f"{base}_{op.lower()}_out", like=inputs[0])  # every tensor made here has x's dtype
    nodes.append(gs.Node(op=op, name=g.unique_name(f"{base}_{op.lower()}"), attrs=attrs, inputs=inputs, outputs=[out]))
    return out
