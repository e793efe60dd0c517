"""A decoder's scaled-dot-product attention as exporters write it: the patterns. Q is split into
heads from its projection; K and V are split from theirs and repeated by repeat_kv (grouped K/V),
optionally after a KV cache's Concat(past, new) on the sequence axis, or taken as the [B, H, T, d]
heads the graph holds. One form serves group-query-attention (a prefill), standard-attention (a
prefill or a decode step) and cached-attention (K/V heads as given); their proofs are in
toolkit.attention_proofs."""

from __future__ import annotations

from fuse_cli.match import Alt, Const, Op, Pattern, Var

HEADS_PERM, KEY_PERM, LAST_TWO_PERM = [0, 2, 1, 3], [0, 2, 3, 1], [0, 1, 3, 2]
NOT_SET = lambda value: not value  # noqa: E731
SEQUENCE_AXIS = lambda axis: axis in (2, -2)  # noqa: E731


def split(role: str, source: Pattern | None = None) -> Op:
    """The Reshape of `source` (the projection Var(role) where not given) into [B, S, H, d]."""
    return Op("Reshape", Var(role) if source is None else source, Var(f"{role}_shape"), name=f"{role}_split")


def heads(role: str, source: Pattern | None = None) -> Op:
    """[B, H, S, d]: the split, its heads axis moved before the sequence."""
    return Op("Transpose", split(role, source), name=f"{role}_heads", perm=HEADS_PERM)


def flattened_key_t(key: Pattern) -> Op:
    """K^T as torch's dynamo writes it, through a batch-flattened view: Reshape [-1, T, d], Transpose
    [0, 2, 1], Reshape [B, H, d, T] (toolkit.heads.flattened_key_t proves the shapes)."""
    flat = Op("Reshape", key, Var("key_flat_shape"), name="key_flatten")
    return Op("Reshape", Op("Transpose", flat, name="key_t", perm=[0, 2, 1]), Var("key_unflat_shape"),
              name="key_unflatten")


def nan_guarded(softmax: Op) -> Alt:
    """dynamo's SDPA zeroes NaN probabilities, Where(IsNaN(p), 0, p), p this very softmax (the Var
    shares the softmax's name): the identity on a softmax of finite scores. Or no guard."""
    zero = Const(lambda v: v.size == 1 and v.item() == 0)
    return Alt(Op("Where", Op("IsNaN", Var(softmax.name), name="nan_test"), zero, softmax, name="nan_guard"), softmax)


def merged(context: Pattern) -> Op:
    """[B, H, S, d] -> Transpose [0, 2, 1, 3] -> Reshape [B, S, H*d]: the heads merged again."""
    return Op("Reshape", Op("Transpose", context, name="merge_transpose", perm=HEADS_PERM), Var("merge_shape"),
              name="merge")


def cached(role: str) -> Alt:
    """The new heads after the past ones (a decode step's present), or the new heads alone (a prefill)."""
    return Alt(Op("Concat", Var(f"{role}_past"), heads(role), name=f"{role}_cache", axis=SEQUENCE_AXIS), heads(role))


def repeat_kv(source: Pattern, role: str) -> Alt:
    """repeat_kv: [B, KV, T, d] -> Unsqueeze(2) -> Expand [B, KV, n, T, d] -> Reshape [B, KV*n, T, d]; or as is
    (n = 1)."""
    expand = Op("Expand", Op("Unsqueeze", source, Var(f"{role}_axes", optional=True), name=f"{role}_unsqueeze"),
                Var(f"{role}_expand_shape"), name=f"{role}_expand")
    return Alt(Op("Reshape", expand, Var(f"{role}_repeat_shape"), name=f"{role}_repeat"), source)


def repeated(role: str, *, past: bool) -> Alt:
    """repeat_kv of the heads from the projection (past=False) or also after a cache Concat (past=True)."""
    return repeat_kv((cached if past else heads)(role), role)


def scaled(x: Pattern, role: str) -> Alt:
    return Alt(Op(("Mul", "Div"), x, Var(f"{role}_scale", const=True), name=f"{role}_scaling"), x)


def soft_capped(scores: Pattern) -> Alt:
    """Gemma2's soft cap on the scores, tanh(s / c) * c (or s * (1/c)), before the mask; or none."""
    tanh = Op("Tanh", Op(("Div", "Mul"), scores, Var("softcap_in", const=True), name="softcap_in_scaling"),
              name="softcap_tanh")
    return Alt(Op("Mul", tanh, Var("softcap_out", const=True), name="softcap"), scores)


def attention(key: Pattern, value: Pattern) -> Op:
    """merge_heads(softmax(cap(split(Q) K^T * scale) + mask) V) with K and V [B, H, T, d] as `key` and `value`
    match; cap: soft_capped, or none.

    K^T: a Transpose, FusedMatMul's transB, or (torch's dynamo) a batch-flattened view: Reshape
    [-1, T, d], Transpose [0, 2, 1], Reshape [B, H, d, T] (toolkit.heads.flattened_key_t proves it).
    dynamo's SDPA zeroes NaN probabilities, Where(IsNaN(p), 0, p): the identity on a softmax of
    finite scores."""
    key_t = Alt(Op("Transpose", key, name="key_t", perm=LAST_TWO_PERM), flattened_key_t(key))
    scores = scaled(Alt(Op("MatMul", scaled(heads("query"), "query"), scaled(key_t, "key"), name="qk"),
                        Op("FusedMatMul", heads("query"), key, domain="com.microsoft", name="qk", transB=1,
                           transA=NOT_SET, transBatchA=NOT_SET, transBatchB=NOT_SET)), "score")
    scores = soft_capped(scores)
    softmax = Op("Softmax", Alt(Op("Add", scores, Var("mask"), name="mask_add"), scores), name="softmax")
    return merged(Op("MatMul", nan_guarded(softmax), value, name="context"))


# K/V split from their projections, repeated or not: a prefill (group-query-attention)
PREFILL = attention(repeated("key", past=False), repeated("value", past=False))
# the same, or after a cache Concat(past, new): a prefill or a decode step (standard-attention)
DECODER = attention(repeated("key", past=True), repeated("value", past=True))
# K/V as the graph holds them, [B, H, T, d] (cached-attention: the present), repeat_kv'd or not: the
# repeated form is tried first (the match then names the unrepeated heads "key" and "value"), then the
# repeat's output as the heads
OVER_HEADS = attention(repeat_kv(Var("key"), "key"), repeat_kv(Var("value"), "value"))
