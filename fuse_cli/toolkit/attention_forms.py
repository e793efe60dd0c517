"""A decoder's scaled-dot-product attention as exporters write it, with grouped K/V (repeat_kv)
and an optional KV cache (Concat(past, new) on the sequence axis), and the proofs a fusion of it
needs: the head splits, repeat_kv's shapes, the scale, the merge of the heads.

The same forms as passes/group_query_attention.py and passes/cached_attention.py (onnxruntime's
contrib operators), which predate this module, plus the cache Concat, so that one pattern covers
a prefill and a decode step."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.heads import head_split
from fuse_cli.toolkit.shapes import same_dim

HEADS_PERM = [0, 2, 1, 3]
NOT_SET = lambda value: not value  # noqa: E731
SEQUENCE_AXIS = lambda axis: axis in (2, -2)  # noqa: E731


def heads(role: str) -> Op:
    return Op("Transpose", Op("Reshape", Var(role), Var(f"{role}_shape"), name=f"{role}_split"), name=f"{role}_heads",
              perm=HEADS_PERM)


def cached(role: str) -> Alt:
    """The new heads after the past ones (a decode step's present), or the new heads alone (a prefill)."""
    return Alt(Op("Concat", Var(f"{role}_past"), heads(role), name=f"{role}_cache", axis=SEQUENCE_AXIS), heads(role))


def repeated(role: str) -> Alt:
    """repeat_kv: [B, KV, T, d] -> Unsqueeze(2) -> Expand [B, KV, n, T, d] -> Reshape [B, KV*n, T, d]; or as is (n = 1)."""
    expand = Op("Expand", Op("Unsqueeze", cached(role), Var(f"{role}_axes", optional=True), name=f"{role}_unsqueeze"),
                Var(f"{role}_expand_shape"), name=f"{role}_expand")
    return Alt(Op("Reshape", expand, Var(f"{role}_repeat_shape"), name=f"{role}_repeat"), cached(role))


def scaled(x, role: str) -> Alt:
    return Alt(Op(("Mul", "Div"), x, Var(f"{role}_scale", const=True), name=f"{role}_scaling"), x)


# K^T: a Transpose, FusedMatMul's transB, or (torch's dynamo) a batch-flattened view: Reshape [-1, T, d],
# Transpose [0, 2, 1], Reshape [B, H, d, T] (toolkit.heads.flattened_key_t proves it)
KEY_T = Alt(Op("Transpose", repeated("key"), name="key_t", perm=[0, 1, 3, 2]),
            Op("Reshape", Op("Transpose", Op("Reshape", repeated("key"), Var("key_flat_shape"), name="key_flatten"),
                             name="key_t", perm=[0, 2, 1]), Var("key_unflat_shape"), name="key_unflatten"))
SCORES = scaled(Alt(Op("MatMul", scaled(heads("query"), "query"), scaled(KEY_T, "key"), name="qk"),
                    Op("FusedMatMul", heads("query"), repeated("key"), domain="com.microsoft", name="qk", transB=1,
                       transA=NOT_SET, transBatchA=NOT_SET, transBatchB=NOT_SET)), "score")
SOFTMAX = Op("Softmax", Alt(Op("Add", SCORES, Var("mask"), name="mask_add"), SCORES), name="softmax")
# dynamo's SDPA zeroes NaN probabilities, Where(IsNaN(p), 0, p): the identity on a softmax of finite scores
PROBS = Alt(Op("Where", Op("IsNaN", Var("softmax"), name="nan_test"), Const(lambda v: v.size == 1 and v.item() == 0),
               SOFTMAX, name="nan_guard"), SOFTMAX)
CONTEXT = Op("MatMul", PROBS, repeated("value"), name="context")
MERGED = Op("Reshape", Op("Transpose", CONTEXT, name="merge_transpose", perm=HEADS_PERM), Var("merge_shape"), name="merge")


def split_of(m: Match, g: GraphEditor, role: str) -> tuple[int, int] | Decline:
    """(heads, head size) of the Reshape splitting the [B, S, heads*head_size] input (toolkit.heads)."""
    reshape = m.node(f"{role}_split")
    split = head_split(reshape, g)
    if split is None:
        source = g.shape(m.tensor(role))
        return Decline(f"{reshape.name} is not provably a split of {m.tensor(role).name!r} "
                       f"({source and list(source.dims)}) into [batch, sequence, heads, head_size]")
    return split


def repeat_decline(m: Match, g: GraphEditor, role: str, h: int, kv: int) -> Decline | None:
    """repeat_kv's Unsqueeze(2), Expand and Reshape give [B, KV, n, T, d] then [B, KV*n, T, d], n = h / kv."""
    if f"{role}_repeat" not in m.nodes:
        return None if kv == h else Decline(f"{role} has {kv} heads, not {h}, and is not repeated by repeat_kv")
    source = g.shape(m.node(f"{role}_unsqueeze").inputs[0])
    axes = m.tensor(f"{role}_axes")
    axes = constant_value(axes) if axes is not None else m.node(f"{role}_unsqueeze").attrs.get("axes")
    expanded, merged = (g.shape(m.node(f"{role}_{n}").outputs[0]) for n in ("expand", "repeat"))
    wanted = (source and [source.dims[0], kv, h // kv, *source.dims[2:]], source and [source.dims[0], h, *source.dims[2:]])
    if (axes is None or [int(a) for a in np.ravel(axes)] != [2] or expanded is None or merged is None or source is None
            or expanded.rank != 5 or merged.rank != 4
            or not all(same_dim(a, b) for a, b in zip(expanded.dims, wanted[0]))
            or not all(same_dim(a, b) for a, b in zip(merged.dims, wanted[1]))):
        return Decline(f"{m.node(f'{role}_repeat').name} is not provably repeat_kv: Unsqueeze(2) {axes}, Expand to "
                       f"{expanded and list(expanded.dims)} and Reshape to {merged and list(merged.dims)}, where "
                       f"{wanted[0]} and {wanted[1]} are needed")
    return None


def scale_decline(m: Match) -> Decline | None:
    for role in ("query", "key", "score"):
        if m.tensor(f"{role}_scale") is not None:
            c = constant_value(m.tensor(f"{role}_scale"))
            if c.size != 1 or not np.isfinite(c).all() or not c.any():
                return Decline(f"{m.node(f'{role}_scaling').name} scales by {c.reshape(-1)[:4].tolist()}, "
                               f"not a finite nonzero scalar")
    return None


def scale_of(m: Match) -> float:
    """The product of the constant scalars on Q, K^T and the scores (and FusedMatMul's alpha), in float64."""
    scale = float(m.node("qk").attrs.get("alpha", 1.0))
    for role in ("query", "key", "score"):
        if m.tensor(f"{role}_scale") is not None:
            c = float(constant_value(m.tensor(f"{role}_scale")).reshape(-1)[0])
            scale *= c if m.node(f"{role}_scaling").op == "Mul" else 1.0 / c
    return scale


def merged_rows(m: Match, hidden: int) -> bool:
    """The merge is [-1, H*d]: dynamo's GPT-2 merges straight into the [B*S, H*d] rows its Gemm reads
    (a Reshape of the fused [B, S, H*d] output gives the same rows)."""
    merged = constant_value(m.tensor("merge_shape"))
    return merged is not None and [int(s) for s in merged.reshape(-1)] == [-1, hidden]


def merge_decline(m: Match, g: GraphEditor, hidden: int) -> Decline | None:
    """The merge Reshape gives [B, S, H*d] of the query's B and S (a constant [0, 0|-1, H*d], or by
    inference), or its rows [B*S, H*d] (merged_rows)."""
    if merged_rows(m, hidden):
        return None
    q = g.shape(m.tensor("query"))
    merged, out = constant_value(m.tensor("merge_shape")), g.shape(m.root.outputs[0])
    if merged is None:
        if (out is not None and out.rank == 3 and out.static(2) == hidden and same_dim(out.dims[0], q.dims[0])
                and same_dim(out.dims[1], q.dims[1])):
            return None
    elif [int(s) for s in merged.reshape(-1)] in ([0, 0, hidden], [0, -1, hidden]) and not m.root.attrs.get("allowzero", 0):
        return None
    return Decline(f"{m.node('merge').name} reshapes to {merged}, not [0, 0, {hidden}] or [-1, {hidden}] (merging the heads)")


def read_outside(t: gs.Tensor, m: Match, g: GraphEditor) -> bool:
    covered = {id(n) for n in m.covered}
    return g.is_graph_output(t) or any(id(reader) not in covered for reader in t.outputs)
