"""Multi-head self-/cross-attention (BERT, GPT-2, ViT exports) -> com.microsoft MultiHeadAttention."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Pattern, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.attention_bias import attention_bias, bias_decline
from fuse_cli.toolkit.attention_forms import (KEY_PERM, LAST_TWO_PERM, NOT_SET, flattened_key_t, heads,
                                              merged, nan_guarded, scaled, split)
from fuse_cli.toolkit.attention_proofs import key_t_decline, merge_decline, scale_decline, scale_of, split_of
from fuse_cli.toolkit.heads import softmax_key_axis_decline
from fuse_cli.toolkit.shapes import same_dim

MS = "com.microsoft"


def projected(role: str) -> Alt:
    """The [B, L, hidden] tensor a Reshape splits into heads: Var(role) plus a constant bias
    MultiHeadAttention absorbs (largest form first), or Var(role) as it is."""
    return Alt(Op("Add", Var(role), Const(lambda v: v.ndim == 1, name=f"{role}_bias"), name=f"{role}_bias_add"),
               Var(role))


QUERY = scaled(heads("query", projected("query")), "query")
KEY_HEADS = heads("key", projected("key"))
# K^T: one Transpose [0, 2, 3, 1] of the split, the heads' last two axes swapped, or (torch's dynamo)
# through a batch-flattened view; FusedMatMul's transB swaps them itself (fused-matmul ran first)
KEY_T = (Op("Transpose", split("key", projected("key")), name="key_t", perm=KEY_PERM),
         Op("Transpose", KEY_HEADS, name="key_t", perm=LAST_TWO_PERM))


def fused_scores(key: Pattern, trans_b) -> Op:
    return Op("FusedMatMul", QUERY, scaled(key, "key"), domain=MS, name="qk", transB=trans_b, transA=NOT_SET,
              transBatchA=NOT_SET, transBatchB=NOT_SET)


SCORES = scaled(Alt(Op("MatMul", QUERY, scaled(Alt(*KEY_T, flattened_key_t(KEY_HEADS)), "key"), name="qk"),
                    fused_scores(Alt(*KEY_T), NOT_SET), fused_scores(KEY_HEADS, 1)), "score")
CAUSAL = Alt(Op("Where", Var("keep"), SCORES, Var("fill", const=True), name="causal"),
             Op("Where", Var("drop"), Var("fill", const=True), SCORES, name="causal"), SCORES)
SOFTMAX = Op("Softmax", Alt(Op("Add", CAUSAL, Var("mask"), name="mask_add"), CAUSAL), name="softmax")
CONTEXT = Op("MatMul", nan_guarded(SOFTMAX), heads("value", projected("value")), name="context")


@register
class FuseMultiHeadAttention(PatternPass):
    """y = merge_heads(softmax(split(Q) split(K)^T * scale + bias) split(V)), per head

      x ─ MatMul(Wq) ─ Add(bq) ─ Reshape[0,-1,H,d] ─ Transpose[0,2,1,3] ─ (*c) ─┐
     kv ─ MatMul(Wk) ─ Add(bk) ─ Reshape[0,-1,H,d] ─ Transpose[0,2,3,1] ─ (*c) ─ MatMul ─ (/c or *c)
       ─ (Where(causal, s, fill)) ─ (Add(mask)) ─ Softmax(-1) ─ MatMul ─ Transpose ─ Reshape[0,0,H*d]
     kv ─ MatMul(Wv) ─ Add(bv) ─ Reshape[0,-1,H,d] ─ Transpose[0,2,1,3] ──────────┘
       =>  MultiHeadAttention(x·Wq, kv·Wk, kv·Wv, bias=[bq,bk,bv], attention_bias; num_heads=H, scale)

    MultiHeadAttention, not the packed Attention: it takes key/value from another input
    (cross-attention), needs no concatenated copy of the weights, and accepts projections that
    are not constant MatMuls (GPT-2's Split of one packed projection); onnxruntime's CPU runs both.
    The Q/K/V MatMuls stay; a constant [hidden] bias Add on each is absorbed. K^T is one Transpose
    [0,2,3,1], or [0,2,1,3] then [0,1,3,2] (or FusedMatMul's transB). scale is the product of the
    constant scalar Mul/Div on Q, K^T and the scores (emitted when it is not 1/sqrt(d)), times alpha
    when fused-matmul already made Q.K^T a FusedMatMul. attention_bias (rank 4: B or 1, H or 1, S,
    T) is what the graph adds to the scores: its own mask, plus Where(causal, 0, fill) for a
    causal Where -- equal to the Where when fill <= -1e30, as s + fill then rounds to fill -- and
    an Expand to [1, 1, S, T] unless its last dims are statically S and T (broadcasting them is
    not allowed). Heads and head size come from constant Reshape shapes matching [B, L, H*d]; L
    is 0, -1 or, for a static sequence (ViT's 197 tokens, written out by static-reshape-shape),
    the tensor's static length itself.

    torch.onnx.export(dynamo=True) writes scaled_dot_product_attention with a static length as
    [-1, S, H, d] splits, K^T through a batch-flattened view (Reshape [-1, S, d], Transpose
    [0, 2, 1], Reshape [-1, H, d, S]) and Where(IsNaN(p), 0, p) after the softmax: matched too
    (vit-base dynamo: 12 MultiHeadAttention, 0.96x CPU time, 0.73x peak). Exact for finite
    inputs; where the inputs hold NaN or inf the guard's zeros become the kernel's NaN. With the
    length computed at run time (BERT's dynamo export: bert-base 540 -> 214 nodes) the split and
    merge Reshapes are judged by their inferred output shapes, and K^T's flattening by the Shape
    dims its shape vectors read.
    """

    name = "attention"
    description = "Fuse multi-head attention (Reshape/Transpose/MatMul/Softmax) into MultiHeadAttention"
    label = "multi-head attention -> MultiHeadAttention"
    emits = ("com.microsoft::MultiHeadAttention",)
    min_opset = 8  # Expand shapes the attention_bias (a Where is emitted only where the graph has one)
    pattern = merged(CONTEXT)

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
            return decline
        splits = {role: split_of(m, g, role) for role in ("query", "key", "value")}
        if declined := next((s for s in splits.values() if isinstance(s, Decline)), None):
            return declined
        if declined := next(filter(None, (_bias_size_decline(m, g, role, *splits[role]) for role in splits)), None):
            return declined
        (h, d), (hk, dk), (hv, dv) = splits.values()
        if (h, d) != (hk, dk) or hv != h:
            return Decline(f"the heads differ: query {h}x{d}, key {hk}x{dk}, value {hv}x{dv}")
        q, k, v = (g.shape(m.tensor(role)) for role in ("query", "key", "value"))
        if not same_dim(q.dims[0], k.dims[0]) or not same_dim(k.dims[0], v.dims[0]):
            return Decline("the query, key and value batch sizes are not provably equal (MatMul would broadcast them)")
        if decline := key_t_decline(m, g, d) or merge_decline(m, g, hv * dv, rows=False) or scale_decline(m):
            return decline
        alpha = m.node("qk").attrs.get("alpha", 1.0)
        if not (np.isfinite(alpha) and alpha != 0):
            return Decline(f"{m.node('qk').name} scales by alpha {alpha}, not a finite nonzero scalar")
        return bias_decline(m, g, h, q)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        h, d = split_of(m, g, "query")
        scale = scale_of(m)  # float64 product, rounded once into the attribute
        attrs = {"num_heads": h} if np.isclose(scale, d**-0.5, rtol=1e-6, atol=0) else {"num_heads": h, "scale": scale}
        roles = ("query", "key", "value")
        qkv = [m.tensor(role) for role in roles]
        bias = None
        if any(m.tensor(f"{role}_bias") is not None for role in roles):
            parts = [constant_value(m.tensor(f"{r}_bias")) if m.tensor(f"{r}_bias") is not None
                     else np.zeros(g.shape(t).dims[-1], g.dtype(t)) for r, t in zip(roles, qkv)]
            bias = g.constant(f"{m.node('merge').name}_qkv_bias", np.concatenate(parts).astype(g.dtype(qkv[0])))
        b = g.builder("attention")
        mask = attention_bias(m, g, b, qkv[0], qkv[1])
        empty = gs.Variable.empty()
        b.op.MultiHeadAttention(*qkv, empty if bias is None else bias, empty, mask, _domain=MS,
                                _outputs=m.root.outputs[:1], _name=f"{m.node('softmax').name}_mha", **attrs)
        return Replacement(nodes=b.nodes)


def _bias_size_decline(m: Match, g: GraphEditor, role: str, count: int, size: int) -> Decline | None:
    """A projection's bias MultiHeadAttention absorbs is a [heads * head_size] vector of its type."""
    bias = m.tensor(f"{role}_bias")
    if bias is not None and (constant_value(bias).size != count * size or g.dtype(bias) != g.dtype(m.tensor(role))):
        return Decline(f"{m.node(f'{role}_bias_add').name}'s bias {bias.name!r} is not a [{count * size}] vector "
                       "of the input's type")
    return None
