"""Attention over K/V the graph already holds as heads [B, H, T, d] (a decoder's KV cache:
Concat(past, new), repeated by repeat_kv or not) -> com.microsoft MultiHeadAttention."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.heads import flattened_key_t, head_split, softmax_key_axis_decline
from fuse_cli.toolkit.shapes import same_dim

HEADS_PERM = [0, 2, 1, 3]
NOT_SET = lambda value: not value  # noqa: E731


def scaled(x, role: str) -> Alt:
    return Alt(Op(("Mul", "Div"), x, Var(f"{role}_scale", const=True), name=f"{role}_scaling"), x)


QUERY = Op("Transpose", Op("Reshape", Var("query"), Var("query_shape"), name="query_split"), name="query_heads",
           perm=HEADS_PERM)
# K^T: a Transpose, FusedMatMul's transB, or dynamo's batch-flattened view (toolkit.heads.flattened_key_t)
KEY_T = Alt(Op("Transpose", Var("key"), name="key_t", perm=[0, 1, 3, 2]),
            Op("Reshape", Op("Transpose", Op("Reshape", Var("key"), Var("key_flat_shape"), name="key_flatten"),
                             name="key_t", perm=[0, 2, 1]), Var("key_unflat_shape"), name="key_unflatten"))
SCORES = scaled(Alt(Op("MatMul", scaled(QUERY, "query"), scaled(KEY_T, "key"), name="qk"),
                    Op("FusedMatMul", QUERY, Var("key"), domain="com.microsoft", name="qk", transB=1,
                       transA=NOT_SET, transBatchA=NOT_SET, transBatchB=NOT_SET)), "score")
SOFTMAX = Op("Softmax", Alt(Op("Add", SCORES, Var("mask"), name="mask_add"), SCORES), name="softmax")
# dynamo's SDPA zeroes NaN probabilities, Where(IsNaN(p), 0, p): the identity on a softmax of finite scores
PROBS = Alt(Op("Where", Op("IsNaN", Var("softmax"), name="nan_test"), Const(lambda v: v.size == 1 and v.item() == 0),
               SOFTMAX, name="nan_guard"), SOFTMAX)


@register
class FuseCachedAttention(PatternPass):
    """y = merge_heads(softmax(split(Q) K^T * scale + mask) V), K and V given as heads [B, H, T, d]

      q [B, S, H*d] ─ Reshape[0,0,H,d] ─ Transpose[0,2,1,3] ─┐
      K [B, H, T, d] (present = Concat(past, new), repeat_kv'd) ─ Transpose ─ MatMul ─ (*c) ─ (Add(mask))
        ─ Softmax ─ MatMul ─ Transpose[0,2,1,3] ─ Reshape[0,0,H*d]
      V [B, H, T, d] ──────────────────────────────────────────────────┘
        =>  MultiHeadAttention(q, K, V, attention_bias=mask; num_heads=H, scale)

    A decode step's attention reads K/V that are not split from a [B, T, H*d] projection: the
    cache's Concat(past, new) (a graph output, the present), repeated to H heads for grouped
    K/V. MultiHeadAttention takes key and value in that [B, H, T, d] layout as they are (no past
    inputs then), so the Concat and the repeat stay and their outputs are read, not rebuilt; the
    scores and probabilities [B, H, S, T] are never written. The graph's own mask (causal with the
    past's offset, padding) is passed unchanged as attention_bias, [B or 1, 1 or H, S, T] by the
    inferred shapes, so whatever mask the graph computes stays exact. GroupQueryAttention would
    take the unrepeated cache, but onnxruntime 1.31's CPU kernel refuses a past with batch > 1 and
    sequence > 1 ("batch_size must be 1 when sequence_length > 1 and past context is given"),
    which symbolic dims cannot rule out. Runs after group-query-attention and attention, which
    fuse the prefill forms whose K/V come straight from a projection.
    """

    name = "cached-attention"
    description = "Fuse attention over K/V heads the graph holds (a KV cache's present) into MultiHeadAttention"
    label = "attention over cached K/V -> MultiHeadAttention"
    emits = ("com.microsoft::MultiHeadAttention",)
    min_opset = 8
    pattern = Op("Reshape", Op("Transpose", Op("MatMul", PROBS, Var("value"), name="context"), name="merge_transpose",
                               perm=HEADS_PERM), Var("merge_shape"), name="merge")

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
            return decline
        split = head_split(m.node("query_split"), g)
        if split is None:
            return Decline(f"{m.node('query_split').name} is not provably a split of {m.tensor('query').name!r} into "
                           f"[batch, sequence, heads, head_size]")
        h, d = split
        q, k, v = (g.shape(m.tensor(r)) for r in ("query", "key", "value"))
        if k is None or v is None or k.rank != 4 or v.rank != 4:
            return Decline(f"key {k and list(k.dims)} and value {v and list(v.dims)} are not [batch, heads, length, "
                           f"head_size] tensors")
        if not (k.static(1) == v.static(1) == h and k.static(3) == v.static(3) == d):
            return Decline(f"the heads differ: query {h}x{d}, key {list(k.dims)[1::2]}, value {list(v.dims)[1::2]} "
                           f"(MultiHeadAttention takes K/V already repeated to {h} heads)")
        if not (same_dim(q.dims[0], k.dims[0]) and same_dim(k.dims[0], v.dims[0]) and same_dim(k.dims[2], v.dims[2])):
            return Decline(f"query {list(q.dims)}, key {list(k.dims)} and value {list(v.dims)} are not provably one "
                           f"batch, with one key length")
        if "key_flatten" in m.nodes and not flattened_key_t(m, g, d):
            return Decline(f"{m.node('key_flatten').name} and {m.node('key_unflatten').name} are not provably K^T "
                           f"through a batch-flattened view ([-1, T, {d}], Transpose [0, 2, 1], [B, H, {d}, T])")
        merged, out = constant_value(m.tensor("merge_shape")), g.shape(m.root.outputs[0])
        by_inference = (merged is None and out is not None and out.rank == 3 and out.static(2) == h * d
                        and same_dim(out.dims[0], q.dims[0]) and same_dim(out.dims[1], q.dims[1]))
        if not by_inference and _merged_rows(m, h * d) is None:
            return Decline(f"{m.node('merge').name} reshapes to {merged}, not [0, 0, {h * d}] or [-1, {h * d}] "
                           f"(merging the heads)")
        for role in ("query", "key", "score"):
            if m.tensor(f"{role}_scale") is not None:
                c = constant_value(m.tensor(f"{role}_scale"))
                if c.size != 1 or not np.isfinite(c).all() or not c.any():
                    return Decline(f"{m.node(f'{role}_scaling').name} scales by {c.reshape(-1)[:4].tolist()}, "
                                   f"not a finite nonzero scalar")
        mask = m.tensor("mask")
        shape = g.shape(mask) if mask is not None else None
        if mask is not None and (shape is None or shape.rank != 4 or shape.dims[0] not in (1, q.dims[0])
                                 or shape.dims[1] not in (1, h) or not same_dim(shape.dims[2], q.dims[1])
                                 or not same_dim(shape.dims[3], k.dims[2]) or g.dtype(mask) != g.dtype(m.tensor("query"))):
            return Decline(f"the mask {mask.name!r} of shape {shape and list(shape.dims)} is not provably "
                           f"[batch or 1, 1 or {h}, sequence, key length] of the query's dtype (attention_bias)")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        h, d = head_split(m.node("query_split"), g)
        scale = float(m.node("qk").attrs.get("alpha", 1.0))  # float64 product, rounded once into the attribute
        for role in ("query", "key", "score"):
            if m.tensor(f"{role}_scale") is not None:
                c = float(constant_value(m.tensor(f"{role}_scale")).reshape(-1)[0])
                scale *= c if m.node(f"{role}_scaling").op == "Mul" else 1.0 / c
        attrs = {"num_heads": h}
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        inputs = [m.tensor("query"), m.tensor("key"), m.tensor("value")]
        if m.tensor("mask") is not None:
            inputs += [gs.Variable.empty(), gs.Variable.empty(), m.tensor("mask")]
        base = m.node("softmax").name
        if _merged_rows(m, h * d) is not True:
            return Replacement(nodes=[gs.Node("MultiHeadAttention", g.unique_name(f"{base}_mha"), attrs, inputs,
                                              [m.root.outputs[0]], domain="com.microsoft")])
        y = g.variable(f"{base}_mha_out")
        return Replacement(nodes=[
            gs.Node("MultiHeadAttention", g.unique_name(f"{base}_mha"), attrs, inputs, [y], domain="com.microsoft"),
            gs.Node("Reshape", g.unique_name(f"{base}_rows"), {}, [y, m.tensor("merge_shape")], [m.root.outputs[0]])])


def _merged_rows(m: Match, hidden: int) -> bool | None:
    """False: the merge is [0, 0 or -1, H*d] ([B, S, H*d], what MultiHeadAttention outputs);
    True: [-1, H*d] (dynamo's GPT-2 merges straight into the [B*S, H*d] rows its Gemm reads: a
    Reshape of the fused output then gives the same rows); None: neither."""
    merged = constant_value(m.tensor("merge_shape"))
    shape = None if merged is None else [int(s) for s in merged.reshape(-1)]
    if shape == [-1, hidden]:
        return True
    if shape in ([0, 0, hidden], [0, -1, hidden]) and not m.root.attrs.get("allowzero", 0):
        return False
    return None
