"""Grouped-query attention of decoder LLMs (Llama, Qwen2, Mistral prefill: K/V heads repeated by
repeat_kv) -> com.microsoft GroupQueryAttention."""

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


def heads(role: str) -> Op:
    return Op("Transpose", Op("Reshape", Var(role), Var(f"{role}_shape"), name=f"{role}_split"), name=f"{role}_heads",
              perm=HEADS_PERM)


def repeated(role: str) -> Alt:
    """repeat_kv: [B, KV, S, d] -> Unsqueeze(2) -> Expand [B, KV, n, S, d] -> Reshape [B, KV*n, S, d]; or as is (n = 1)."""
    expand = Op("Expand", Op("Unsqueeze", heads(role), Var(f"{role}_axes", optional=True), name=f"{role}_unsqueeze"),
                Var(f"{role}_expand_shape"), name=f"{role}_expand")
    return Alt(Op("Reshape", expand, Var(f"{role}_repeat_shape"), name=f"{role}_repeat"), heads(role))


def scaled(x, role: str) -> Alt:
    return Alt(Op(("Mul", "Div"), x, Var(f"{role}_scale", const=True), name=f"{role}_scaling"), x)


# K^T: a Transpose, FusedMatMul's transB, or (torch's dynamo) a batch-flattened view: Reshape [-1, S, d],
# Transpose [0, 2, 1], Reshape [B, H, d, S], which check() proves from the shape vectors
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


@register
class FuseGroupQueryAttention(PatternPass):
    """y = merge_heads(softmax(Q repeat_kv(K)^T * scale + mask) repeat_kv(V))

      q [B, S, H*d]  ─ Reshape[0,0,H,d]  ─ Transpose[0,2,1,3] ──────────────────────────────────┐
      k [B, S, KV*d] ─ Reshape[0,0,KV,d] ─ Transpose ─ Unsqueeze(2) ─ Expand ─ Reshape ─ Transpose ─ MatMul ─ (*c)
        ─ (Add(mask)) ─ Softmax ─ MatMul ─ Transpose[0,2,1,3] ─ Reshape[0,0,H*d]
      v [B, S, KV*d] ─ Reshape[0,0,KV,d] ─ Transpose ─ Unsqueeze(2) ─ Expand ─ Reshape ──┘
        =>  GroupQueryAttention(q, k, v, seqlens_k=S-1 per row, total_sequence_length=S,
                                attention_bias=mask; num_heads=H, kv_num_heads=KV, causal=0)

    repeat_kv makes head h read K/V head h // n (the Reshape merges [KV, n] row-major), which is
    GroupQueryAttention's grouping, so the repeated copies are never built. With causal=0 the
    kernel adds attention_bias and masks nothing itself: the graph's own mask (causal and padding,
    [B or 1, 1, S, S]) is passed as it is, so any mask the graph computes stays exact; seqlens_k
    and total_sequence_length then say "a prompt of S tokens, no past" for every row. Q and K come
    in their [B, S, hidden] form (rotary-embedding leaves them so). The repeat's shapes are proved
    from the inferred shapes ([B, KV, n, S, d] and [B, KV*n, S, d]); scale is the product of the
    constant scalars on the scores (and FusedMatMul's alpha). CPU kernel: float32, float16, head
    size % 8 == 0; CUDA's has no float32 kernel and its causal=0 + attention_bias path is not
    verified by fuse, so targets with CUDA decline. A prefill graph's present K/V outputs (the K/V
    heads before the repeat) become the node's present_key/present_value outputs.
    """

    name = "group-query-attention"
    description = "Fuse grouped-query attention (repeat_kv'd K/V, mask, Softmax) into GroupQueryAttention"
    label = "grouped-query attention -> GroupQueryAttention"
    emits = ("com.microsoft::GroupQueryAttention",)
    # A prefill graph's present K/V (graph outputs) are the split K/V heads [B, KV, S, d]: without
    # a past, that is exactly what GroupQueryAttention's present_key/present_value outputs hold.
    keeps = ("key_heads", "value_heads")
    pattern = Op("Reshape", Op("Transpose", CONTEXT, name="merge_transpose", perm=HEADS_PERM), Var("merge_shape"),
                 name="merge")

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
            return decline
        split = {role: _split(m, g, role) for role in ("query", "key", "value")}
        for value in split.values():
            if isinstance(value, Decline):
                return value
        (h, d), (kv, dk), (kv_v, dv) = split.values()
        if dk != d or dv != d or kv_v != kv or h % kv:
            return Decline(f"the heads do not group: query {h}x{d}, key {kv}x{dk}, value {kv_v}x{dv}")
        if d % 8:
            return Decline(f"head size {d} is not a multiple of 8, which GroupQueryAttention's CPU kernel needs")
        for role in ("key", "value"):
            reason = _repeat_reason(m, g, role, h, kv)
            if reason:
                return Decline(reason)
        q, k, v = (g.shape(m.tensor(r)) for r in ("query", "key", "value"))
        if not (same_dim(q.dims[0], k.dims[0]) and same_dim(k.dims[0], v.dims[0]) and same_dim(q.dims[1], k.dims[1])
                and same_dim(k.dims[1], v.dims[1])):
            return Decline(f"query {list(q.dims)}, key {list(k.dims)} and value {list(v.dims)} are not provably one "
                           f"batch of one sequence (self-attention without a past)")
        merged, merged_out = constant_value(m.tensor("merge_shape")), g.shape(m.root.outputs[0])
        by_inference = (merged is None and merged_out is not None and merged_out.rank == 3 and merged_out.static(2) == h * d
                        and same_dim(merged_out.dims[0], q.dims[0]) and same_dim(merged_out.dims[1], q.dims[1]))
        if not by_inference and (merged is None or [int(s) for s in merged.reshape(-1)] not in ([0, 0, h * d], [0, -1, h * d])
                                 or m.root.attrs.get("allowzero", 0)):
            return Decline(f"{m.node('merge').name} reshapes to {merged}, not [0, 0, {h * d}] (merging the heads)")
        if "key_flatten" in m.nodes and not flattened_key_t(m, g, d):
            return Decline(f"{m.node('key_flatten').name} and {m.node('key_unflatten').name} are not provably K^T through "
                           f"a batch-flattened view ([-1, S, {d}], Transpose [0, 2, 1], [B, H, {d}, S])")
        for role in ("query", "key", "score"):
            if m.tensor(f"{role}_scale") is not None:
                c = constant_value(m.tensor(f"{role}_scale"))
                if c.size != 1 or not np.isfinite(c).all() or not c.any():
                    return Decline(f"{m.node(f'{role}_scaling').name} scales by {c.reshape(-1)[:4].tolist()}, "
                                   f"not a finite nonzero scalar")
        mask = m.tensor("mask")
        if mask is not None:
            shape = g.shape(mask)
            if (shape is None or shape.rank != 4 or shape.dims[0] not in (1, q.dims[0]) or shape.dims[1] not in (1, h)
                    or not same_dim(shape.dims[2], q.dims[1]) or not same_dim(shape.dims[3], q.dims[1])
                    or g.dtype(mask) != g.dtype(m.tensor("query"))):
                return Decline(f"the mask {mask.name!r} of shape {shape and list(shape.dims)} is not provably "
                               f"[batch or 1, 1 or {h}, sequence, sequence] of the query's dtype (attention_bias)")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        h, d = _split(m, g, "query")
        kv, _ = _split(m, g, "key")
        scale = float(m.node("qk").attrs.get("alpha", 1.0))  # float64 product, rounded once into the attribute
        for role in ("query", "key", "score"):
            if m.tensor(f"{role}_scale") is not None:
                c = float(constant_value(m.tensor(f"{role}_scale")).reshape(-1)[0])
                scale *= c if m.node(f"{role}_scaling").op == "Mul" else 1.0 / c
        attrs = {"num_heads": h, "kv_num_heads": kv, "causal": 0}
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        base, nodes = m.node("softmax").name, []
        key = m.tensor("key")
        dims = _node(g, nodes, "Shape", [key], base)  # [B, S, KV*d]: a prompt of S tokens per row
        length = _node(g, nodes, "Gather", [dims, g.constant(f"{base}_one", np.array(1, np.int64))], base, axis=0)
        total = _node(g, nodes, "Cast", [length], base, to=6)
        last = _node(g, nodes, "Sub", [total, g.constant(f"{base}_int32_one", np.array(1, np.int32))], base)
        batch = _node(g, nodes, "Slice", [dims, *(g.constant(f"{base}_b{v}", np.array([v], np.int64)) for v in (0, 1))],
                      base)
        seqlens = _node(g, nodes, "Expand", [last, batch], base)
        mask = m.tensor("mask")
        inputs = [m.tensor("query"), key, m.tensor("value"), gs.Variable.empty(), gs.Variable.empty(), seqlens, total]
        if mask is not None:
            inputs += [gs.Variable.empty()] * 3 + [mask]
        presents = [m.node(f"{role}_heads").outputs[0] for role in ("key", "value")]
        outputs = [m.root.outputs[0]]
        if any(_read_outside(t, m, g) for t in presents):
            # Both or neither: the kernel refuses one present without the other (BERT's dynamo
            # export reads only K's heads again); the one nobody reads gets a name of its own.
            outputs += [t if _read_outside(t, m, g) else g.variable(f"{base}_present_{role}")
                        for t, role in zip(presents, ("key", "value"))]
        nodes.append(gs.Node("GroupQueryAttention", g.unique_name(f"{base}_gqa"), attrs, inputs, outputs,
                             domain="com.microsoft"))
        return Replacement(nodes=nodes)


def _split(m: Match, g: GraphEditor, role: str) -> tuple[int, int] | Decline:
    """(heads, head size) of the Reshape splitting the [B, S, heads*head_size] input (toolkit.heads)."""
    reshape = m.node(f"{role}_split")
    split = head_split(reshape, g)
    if split is None:
        source = g.shape(m.tensor(role))
        return Decline(f"{reshape.name} is not provably a split of {m.tensor(role).name!r} "
                       f"({source and list(source.dims)}) into [batch, sequence, heads, head_size]")
    return split


def _repeat_reason(m: Match, g: GraphEditor, role: str, h: int, kv: int) -> str | None:
    """repeat_kv's Unsqueeze(2), Expand and Reshape give [B, KV, n, S, d] then [B, KV*n, S, d], n = h / kv."""
    if f"{role}_repeat" not in m.nodes:
        return None if kv == h else f"{role} has {kv} heads, not {h}, and is not repeated by repeat_kv"
    source = g.shape(m.node(f"{role}_heads").outputs[0])
    axes = m.tensor(f"{role}_axes")
    axes = constant_value(axes) if axes is not None else m.node(f"{role}_unsqueeze").attrs.get("axes")
    expanded, merged = (g.shape(m.node(f"{role}_{n}").outputs[0]) for n in ("expand", "repeat"))
    wanted = (source and [source.dims[0], kv, h // kv, *source.dims[2:]], source and [source.dims[0], h, *source.dims[2:]])
    if (axes is None or [int(a) for a in np.ravel(axes)] != [2] or expanded is None or merged is None or source is None
            or not all(same_dim(a, b) for a, b in zip(expanded.dims, wanted[0]))
            or not all(same_dim(a, b) for a, b in zip(merged.dims, wanted[1]))
            or expanded.rank != 5 or merged.rank != 4):
        return (f"{m.node(f'{role}_repeat').name} is not provably repeat_kv: Unsqueeze(2) {axes}, Expand to "
                f"{expanded and list(expanded.dims)} and Reshape to {merged and list(merged.dims)}, where "
                f"{wanted[0]} and {wanted[1]} are needed")
    return None


def _read_outside(t: gs.Tensor, m: Match, g: GraphEditor) -> bool:
    covered = {id(n) for n in m.covered}
    return g.is_graph_output(t) or any(id(reader) not in covered for reader in t.outputs)


def _node(g: GraphEditor, nodes: list[gs.Node], op: str, inputs: list[gs.Tensor], base: str, **attrs) -> gs.Variable:
    out = g.variable(f"{base}_{op.lower()}_out")
    nodes.append(gs.Node(op=op, name=g.unique_name(f"{base}_{op.lower()}"), attrs=attrs, inputs=inputs, outputs=[out]))
    return out
