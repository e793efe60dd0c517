"""Grouped-query attention of decoder LLMs (Llama, Qwen2, Mistral prefill: K/V heads repeated by
repeat_kv) -> com.microsoft GroupQueryAttention. The pattern and its proofs are the toolkit's
(attention_forms.PREFILL, attention_proofs), which standard-attention shares."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli import targets
from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.attention_forms import PREFILL
from fuse_cli.toolkit.attention_proofs import (grouped_heads, key_t_decline, mask_fits, merge_decline, merged_rows,
                                               read_outside, scale_decline, scale_of, softcap_of, split_of)
from fuse_cli.toolkit.runtime_shapes import unnamed_like_the_original, unnamed_where_it_was


@register
class FuseGroupQueryAttention(PatternPass):
    """y = merge_heads(softmax(Q repeat_kv(K)^T * scale + mask) repeat_kv(V))

      q [B, S, H*d]  ─ Reshape[0,0,H,d]  ─ Transpose[0,2,1,3] ──────────────────────────────────┐
      k [B, S, KV*d] ─ Reshape[0,0,KV,d] ─ Transpose ─ Unsqueeze(2) ─ Expand ─ Reshape ─ Transpose ─ MatMul ─ (*c)
        ─ (Add(mask)) ─ Softmax ─ MatMul ─ Transpose[0,2,1,3] ─ Reshape[0,0,H*d]
      v [B, S, KV*d] ─ Reshape[0,0,KV,d] ─ Transpose ─ Unsqueeze(2) ─ Expand ─ Reshape ──┘
        =>  GroupQueryAttention(q, k, v, seqlens_k=S-1 per row, total_sequence_length=S,
                                attention_bias=mask; num_heads=H, kv_num_heads=KV, causal=0, softcap)

    repeat_kv makes head h read K/V head h // n (the Reshape merges [KV, n] row-major), which is
    GroupQueryAttention's grouping, so the repeated copies are never built. With causal=0 the
    kernel adds attention_bias and masks nothing itself: the graph's own mask (causal and padding,
    [B or 1, 1, S, S]) is passed as it is, so any mask the graph computes stays exact; seqlens_k
    and total_sequence_length then say "a prompt of S tokens, no past" for every row. Q and K come
    in their [B, S, hidden] form (rotary-embedding leaves them so). The repeat's shapes are proved
    from the inferred shapes ([B, KV, n, S, d] and [B, KV*n, S, d]); scale is the product of the
    constant scalars on the scores (and FusedMatMul's alpha); Gemma2's soft cap tanh(s / c) * c
    on the scaled scores, before the mask, is the kernel's `softcap` (applied in that order). CPU
    kernel: float32, float16, head
    size % 8 == 0; CUDA's has no float32 kernel and its causal=0 + attention_bias path is not
    verified by fuse, so targets with CUDA decline. A prefill graph's present K/V outputs (the K/V
    heads before the repeat) become the node's present_key/present_value outputs. Where the mask
    or K/V was shaped at run time, the output is read through Reshape(y, Shape(y)), as unnamed
    to onnxruntime's planner as the replaced subgraph's (toolkit.runtime_shapes: else layer N's
    MLP buffers stay allocated across layer N+1's attention, 27.7 -> 37.1 MiB measured on the
    opset-17 Llama prefill at 64 x 64; 26.1 so). A merge straight into rows [-1, H*d] (dynamo's
    GPT-2, for its Gemm) reshapes the kernel's [B, S, H*d] output into those rows.
    """

    name = "group-query-attention"
    description = "Fuse grouped-query attention (repeat_kv'd K/V, mask, Softmax) into GroupQueryAttention"
    label = "grouped-query attention -> GroupQueryAttention"
    emits = ("com.microsoft::GroupQueryAttention",)
    # A prefill graph's present K/V (graph outputs) are the split K/V heads [B, KV, S, d]: without
    # a past, that is exactly what GroupQueryAttention's present_key/present_value outputs hold.
    keeps = ("key_heads", "value_heads")
    pattern = PREFILL

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        grouped = grouped_heads(m, g)
        if isinstance(grouped, Decline):
            return grouped
        h, kv, d = grouped
        if d % 8:
            return Decline(f"head size {d} is not a multiple of 8, which GroupQueryAttention's CPU kernel needs")
        if decline := merge_decline(m, g, h * d, rows=True) or key_t_decline(m, g, d) or scale_decline(m):
            return decline
        if isinstance(cap := softcap_of(m), Decline):
            return cap
        if cap is not None and (measured := targets.slower(g.target, "GroupQueryAttention:softcap")) is not None:
            return Decline(measured.reason.format(target=g.target))
        mask = m.tensor("mask")
        if mask is not None and not mask_fits(m, g, h, g.shape(m.tensor("query")).dims[1]):
            shape = g.shape(mask)
            return Decline(f"the mask {mask.name!r} of shape {shape and list(shape.dims)} is not provably "
                           f"[batch or 1, 1 or {h}, sequence, sequence] of the query's dtype (attention_bias)")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        (h, d), (kv, _) = split_of(m, g, "query"), split_of(m, g, "key")
        scale = scale_of(m)  # float64 product, rounded once into the attribute
        attrs = {"num_heads": h, "kv_num_heads": kv, "causal": 0}
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        if (cap := softcap_of(m)) is not None:
            attrs["softcap"] = cap  # the kernel caps the scaled scores, then adds attention_bias
        base = m.node("softmax").name
        b = g.builder(base)
        key = m.tensor("key")
        dims = b.op.Shape(key)  # [B, S, KV*d]: a prompt of S tokens per row
        length = b.op.Gather(dims, g.constant(f"{base}_one", np.array(1, np.int64)), axis=0)
        total = b.op.Cast(length, to=6)
        last = b.op.Sub(total, g.constant(f"{base}_int32_one", np.array(1, np.int32)))
        batch = b.op.Slice(dims, *(g.constant(f"{base}_b{v}", np.array([v], np.int64)) for v in (0, 1)))
        seqlens = b.op.Expand(last, batch)
        nodes = b.nodes
        mask = m.tensor("mask")
        inputs = [m.tensor("query"), key, m.tensor("value"), gs.Variable.empty(), gs.Variable.empty(), seqlens, total]
        if mask is not None:
            inputs += [gs.Variable.empty()] * 3 + [mask]
        presents = [m.node(f"{role}_heads").outputs[0] for role in ("key", "value")]
        kept = [read_outside(t, m, g) for t in presents]
        y = m.root.outputs[0]
        unnamed = unnamed_where_it_was([m.tensor("query"), key, m.tensor("value"), mask], y)
        written = g.variable(f"{base}_gqa_out") if unnamed else y
        outputs = [written]
        if merged_rows(m, h * d):  # [B, S, H*d], then the rows the graph's merge made
            outputs = [g.variable(f"{base}_gqa_heads_merged", like=m.tensor("query"))]
            nodes.append(g.node("Reshape", [outputs[0], m.tensor("merge_shape")], name=f"{base}_rows",
                                outputs=[written]))
        # Heads read after the attention (a prefill's KV cache, or a sliding window's slice of it)
        # are the kernel's present outputs. Both or neither: the kernel refuses one present without
        # the other; one nobody reads gets a name of its own.
        if any(kept):
            outputs += [t if keep else g.variable(f"{base}_present_{role}")
                        for t, keep, role in zip(presents, kept, ("key", "value"))]
        b.add("GroupQueryAttention", inputs, attrs, domain="com.microsoft", outputs=outputs, name=f"{base}_gqa")
        if unnamed:
            nodes += unnamed_like_the_original(written, y, g, base)
        return Replacement(nodes=nodes)
