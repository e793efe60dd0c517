"""Rotary position embedding in the rotate-half form -> ONNX's standard RotaryEmbedding (opset 23).
The pattern and its proofs are toolkit.rotary's, which rotary-embedding shares."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.rotary import RotateHalfFusion, per_batch_row, split_heads


@register
class FuseStandardRotaryEmbedding(RotateHalfFusion):
    """y = x * cos + rotate_half(x) * sin, rotate_half(x) = Concat(-x[..., d/2:], x[..., :d/2])

      x [B, H, S, d] ─┬──────────────────────────────────────── Mul(cos) ─┐
                      ├ Slice[d/2:] ─ Neg ─┐                              Add ─ y
                      └ Slice[:d/2] ───────┴ Concat(-1) ─────── Mul(sin) ─┘
        =>  RotaryEmbedding(x, cos_cache, sin_cache)   (no position_ids; opset 23)
            cos_cache = Expand(Reshape(cos[..., :d/2], [1, S, d/2]), [B, 1, 1]), sin_cache likewise
            (cos [B, 1, S, d] from given position_ids: cos_cache = Reshape(cos[..., :d/2], [0, -1, d/2]))

    Without position_ids the standard operator reads one cache row per (batch, position):
    caches [B, S, d/2]. cos and sin broadcast as [1, 1, S, d] (toolkit.rotary's proofs: one row
    per position of x, equal halves), so their first halves, repeated over the batch, are
    exactly those rows; onnxruntime refuses a batch-1 cache for a larger batch ("Inputs
    'cos_cache' and 'sin_cache' are expected to have the same shape as input 'x'"), hence the
    Expand. cos and sin computed from position_ids given to the model ([B, 1, S, d], a decode
    step's form) already hold one row per (batch, position): their first halves are the caches as
    [B, S, d/2] (Reshape [0, -1, d/2]), no Expand. Where x is Transpose[0,2,1,3](Reshape(x3) to
    [B, S, H, d]), the operator runs on the 3-D x3 (num_heads H) and the split is redone after it,
    so standard-attention finds Q and K in their projected [B, S, H*d] form. onnxruntime's CPU
    kernel: float32, float16 (targets.STANDARD).
    """

    name = "standard-rotary-embedding"
    description = "Fuse rotate-half rotary position embedding into the standard RotaryEmbedding (opset 23)"
    label = "rotary embedding -> RotaryEmbedding (opset 23)"
    emits = ("RotaryEmbedding",)
    min_opset = 23

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x, base = m.tensor("x"), m.node("rotary").name
        b = g.builder(base)
        nodes = b.nodes
        d = g.shape(x).static(3)
        split = split_heads(x, g)
        source = x if split is None else split[0]
        per_row = per_batch_row(m.tensor("cos"), g)  # rotary_decline proved sin of the same form
        repeat = None
        if g.shape(source).dims[0] != 1 and not per_row:  # [B, 1, 1]: Shape(x)[:1] ++ [1, 1]
            dims = b.op.Shape(source, start=0, end=1)
            repeat = b.op.Concat(dims, _ints(g, base, "ones", 1, 1), axis=0)
        caches = []
        for role in ("cos", "sin"):
            first = b.op.Slice(m.tensor(role), _ints(g, base, "zero", 0), _ints(g, base, "half", d // 2),
                               _ints(g, base, "last", -1), _name=f"{base}_{role}_slice")
            rows = b.op.Reshape(first, _ints(g, base, "cache_shape", 0 if per_row else 1, -1, d // 2),
                                _name=f"{base}_{role}_reshape")
            caches.append(rows if repeat is None else b.op.Expand(rows, repeat, _name=f"{base}_{role}_expand"))
        if split is None:
            nodes.append(gs.Node("RotaryEmbedding", g.unique_name(base), {}, [x, *caches], [m.root.outputs[0]]))
            return Replacement(nodes=nodes)
        x3, heads, reshape, transpose = split
        rotated = b.op.RotaryEmbedding(x3, *caches, num_heads=heads)
        rotated.dtype, rotated.shape = g.dtype(x), list(g.shape(x3).dims)  # what later passes of this run read
        split_out = g.variable(f"{base}_split_out", like=x)
        split_out.shape = list(g.shape(reshape.outputs[0]).dims)
        nodes.append(gs.Node("Reshape", g.unique_name(f"{base}_split"), dict(reshape.attrs),
                             [rotated, reshape.inputs[1]],
                             [split_out]))
        nodes.append(gs.Node("Transpose", g.unique_name(f"{base}_heads"), dict(transpose.attrs), [split_out],
                             [m.root.outputs[0]]))
        return Replacement(nodes=nodes)


def _ints(g: GraphEditor, base: str, role: str, *values: int) -> gs.Constant:
    return g.constant(f"{base}_{role}", np.array(values, np.int64))
