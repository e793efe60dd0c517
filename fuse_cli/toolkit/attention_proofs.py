"""The proofs a fusion of toolkit.attention_forms' decoder attention needs: the head splits and
their grouping, repeat_kv's shapes, K^T through dynamo's flattened view, the scale, the mask's
shape, the merge of the heads. Each returns a Decline (or a plain fact) computed from the match."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Match, constant_value
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.heads import flattened_key_t, softmax_key_axis_decline, split_heads_or_reason
from fuse_cli.toolkit.shapes import same_dim


def split_of(m: Match, g: GraphEditor, role: str) -> tuple[int, int] | Decline:
    """(heads, head size) of the Reshape splitting the [B, S, heads*head_size] input `role`
    (toolkit.heads.split_heads_or_reason), or why it is not provably that split."""
    split = split_heads_or_reason(m.node(f"{role}_split"), g, m.tensor(role))
    return Decline(split) if isinstance(split, str) else split


def grouped_heads(m: Match, g: GraphEditor) -> tuple[int, int, int] | Decline:
    """(H, KV, d) of a self-attention over the new tokens: scores normalized over the key axis; Q, K
    and V split into heads of one size d, K and V into KV heads that repeat_kv (or nothing, KV = H)
    repeats to H; the three of one batch and one sequence."""
    if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
        return decline
    split = {role: split_of(m, g, role) for role in ("query", "key", "value")}
    if declined := next((s for s in split.values() if isinstance(s, Decline)), None):
        return declined
    (h, d), (kv, dk), (kv_v, dv) = split.values()
    if dk != d or dv != d or kv_v != kv or h % kv:
        return Decline(f"the heads do not group: query {h}x{d}, key {kv}x{dk}, value {kv_v}x{dv}")
    if decline := repeat_decline(m, g, "key", h, kv) or repeat_decline(m, g, "value", h, kv):
        return decline
    q, k, v = (g.shape(m.tensor(r)) for r in ("query", "key", "value"))
    if not (same_dim(q.dims[0], k.dims[0]) and same_dim(k.dims[0], v.dims[0]) and same_dim(q.dims[1], k.dims[1])
            and same_dim(k.dims[1], v.dims[1])):
        return Decline(f"query {list(q.dims)}, key {list(k.dims)} and value {list(v.dims)} are not provably one "
                       f"batch of one sequence (self-attention over the new tokens)")
    return h, kv, d


def repeat_decline(m: Match, g: GraphEditor, role: str, h: int, kv: int) -> Decline | None:
    """repeat_kv's Unsqueeze(2), Expand and Reshape give [B, KV, n, T, d] then [B, KV*n, T, d], n = h / kv."""
    if f"{role}_repeat" not in m.nodes:
        return None if kv == h else Decline(f"{role} has {kv} heads, not {h}, and is not repeated by repeat_kv")
    source = g.shape(m.node(f"{role}_unsqueeze").inputs[0])
    axes = m.tensor(f"{role}_axes")
    axes = constant_value(axes) if axes is not None else m.node(f"{role}_unsqueeze").attrs.get("axes")
    expanded, merged = (g.shape(m.node(f"{role}_{n}").outputs[0]) for n in ("expand", "repeat"))
    wanted = (source and [source.dims[0], kv, h // kv, *source.dims[2:]],
              source and [source.dims[0], h, *source.dims[2:]])
    if (axes is None or [int(a) for a in np.ravel(axes)] != [2] or expanded is None or merged is None or source is None
            or expanded.rank != 5 or merged.rank != 4
            or not all(same_dim(a, b) for a, b in zip(expanded.dims, wanted[0]))
            or not all(same_dim(a, b) for a, b in zip(merged.dims, wanted[1]))):
        return Decline(f"{m.node(f'{role}_repeat').name} is not provably repeat_kv: Unsqueeze(2) {axes}, Expand to "
                       f"{expanded and list(expanded.dims)} and Reshape to {merged and list(merged.dims)}, where "
                       f"{wanted[0]} and {wanted[1]} are needed")
    return None


def held_heads(m: Match, g: GraphEditor) -> tuple[int, int, int] | Decline:
    """The heads of an attention over held K/V (attention_forms.OVER_HEADS): Q split into h heads of
    d, and K/V [B, KV, T, d] each, KV dividing h, of the query's batch and one key length, repeated
    to h by repeat_kv where KV < h. Returns (h, d, KV)."""
    split = split_of(m, g, "query")
    if isinstance(split, Decline):
        return split
    h, d = split
    q, k, v = (g.shape(m.tensor(role)) for role in ("query", "key", "value"))
    if k is None or v is None or k.rank != 4 or v.rank != 4:
        return Decline(f"key {k and list(k.dims)} and value {v and list(v.dims)} are not [batch, heads, length, "
                       f"head_size] tensors")
    kv = k.static(1)
    if not (kv and kv == v.static(1) and h % kv == 0 and k.static(3) == v.static(3) == d):
        return Decline(f"the heads differ: query {h}x{d}, key {list(k.dims)[1::2]}, value {list(v.dims)[1::2]}")
    if not (same_dim(q.dims[0], k.dims[0]) and same_dim(k.dims[0], v.dims[0]) and same_dim(k.dims[2], v.dims[2])):
        return Decline(f"query {list(q.dims)}, key {list(k.dims)} and value {list(v.dims)} are not provably one "
                       f"batch, with one key length")
    return repeat_decline(m, g, "key", h, kv) or repeat_decline(m, g, "value", h, kv) or (h, d, kv)


def key_t_decline(m: Match, g: GraphEditor, d: int) -> Decline | None:
    """K^T through dynamo's batch-flattened view is K^T only when its shapes read K's own dims."""
    if "key_flatten" not in m.nodes or flattened_key_t(m, g, d):
        return None
    return Decline(f"{m.node('key_flatten').name} and {m.node('key_unflatten').name} are not provably K^T through "
                   f"a batch-flattened view ([-1, T, {d}], Transpose [0, 2, 1], [B, H, {d}, T])")


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


def softcap_of(m: Match) -> float | Decline | None:
    """The soft cap c of tanh(s / c) * c on the scores (attention_forms.soft_capped), in float64; None
    where the scores are not capped."""
    if "softcap" not in m.nodes:
        return None
    inner, outer = (constant_value(m.tensor(f"softcap_{side}")) for side in ("in", "out"))
    if inner is None or outer is None or inner.size != 1 or outer.size != 1:
        return Decline(f"{m.node('softcap_tanh').name} is not between two constant scalars "
                       "(a soft cap tanh(s / c) * c)")
    divisor = float(inner.reshape(-1)[0])
    if m.node("softcap_in_scaling").op == "Mul":
        divisor = 1.0 / divisor if divisor else np.inf
    cap = float(outer.reshape(-1)[0])
    if not (np.isfinite(cap) and cap > 0 and np.isclose(divisor, cap, rtol=1e-6, atol=0)):
        return Decline(f"the scores go through tanh(s / {divisor:g}) * {cap:g}, not a soft cap tanh(s / c) * c "
                       f"with one positive c")
    return cap


def mask_fits(m: Match, g: GraphEditor, h: int, length) -> bool:
    """The additive mask is [B or 1, 1 or H, S, length] of the query's dtype, S the query's length:
    the fused kernels broadcast it over the batch and the heads only."""
    mask, q = m.tensor("mask"), g.shape(m.tensor("query"))
    shape = g.shape(mask)
    return (shape is not None and shape.rank == 4 and shape.dims[0] in (1, q.dims[0]) and shape.dims[1] in (1, h)
            and same_dim(shape.dims[2], q.dims[1]) and same_dim(shape.dims[3], length)
            and g.dtype(mask) == g.dtype(m.tensor("query")))


def merged_rows(m: Match, hidden: int) -> bool:
    """The merge is [-1, H*d]: dynamo's GPT-2 merges straight into the [B*S, H*d] rows its Gemm reads
    (a Reshape of the fused [B, S, H*d] output gives the same rows)."""
    merged = constant_value(m.tensor("merge_shape"))
    return merged is not None and [int(s) for s in merged.reshape(-1)] == [-1, hidden]


def merge_decline(m: Match, g: GraphEditor, hidden: int, *, rows: bool) -> Decline | None:
    """The merge Reshape gives [B, S, H*d] of the query's B and S: a constant [0, 0|-1, H*d] or
    [0, 0, -1] of a [B, S, H, d] context, or [0|-1, S, H*d] with S the query's static length
    written out (ViT's 197; -1 is then exactly the batch), allowzero unset where it holds a 0; or
    by inference; or, where the pass reshapes its output (rows=True), the rows [B*S, H*d]
    (merged_rows)."""
    if rows and merged_rows(m, hidden):
        return None
    q = g.shape(m.tensor("query"))
    merged, out = constant_value(m.tensor("merge_shape")), g.shape(m.root.outputs[0])
    if merged is None:
        if (out is not None and out.rank == 3 and out.static(2) == hidden and same_dim(out.dims[0], q.dims[0])
                and same_dim(out.dims[1], q.dims[1])):
            return None
    else:
        merged = [int(s) for s in merged.reshape(-1)]
        length = q.static(1) if q is not None else None
        if (len(merged) == 3 and merged[2] == hidden and not (m.root.attrs.get("allowzero", 0) and 0 in merged)
                and (merged[:2] in ([0, 0], [0, -1]) or length is not None and merged[0] in (0, -1)
                     and merged[1] == length)):
            return None
        # [0, 0, -1] of the [B, S, H, d] context: -1 is H*d (onnxruntime's quant_pre_process writes it)
        heads = g.shape(m.node("merge").inputs[0])
        if (merged == [0, 0, -1] and heads is not None and heads.rank == 4 and not m.root.attrs.get("allowzero", 0)
                and heads.static(2) is not None and heads.static(3) is not None
                and heads.static(2) * heads.static(3) == hidden):
            return None
    wanted = f"[0, 0, {hidden}] or [-1, {hidden}]" if rows else f"[0, 0, {hidden}]"
    return Decline(f"{m.node('merge').name} reshapes to {merged}, not {wanted} (merging the heads)")


def read_outside(t: gs.Tensor, m: Match, g: GraphEditor) -> bool:
    """t is a graph output or read by a node the match does not cover and that does not die with
    it (a prefill's present K/V heads; not repeat_kv's Shape of them, which only sizes the match)."""
    return g.is_graph_output(t) or bool(g.outside_readers(t, m))
