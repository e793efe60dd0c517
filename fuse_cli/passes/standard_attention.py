"""A decoder's attention, prefill or decode step with a KV cache, grouped K/V or not -> ONNX's
standard Attention (opset 23). The pattern and its proofs are the toolkit's (attention_forms.DECODER,
attention_proofs), which the com.microsoft attention passes share."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.attention_forms import DECODER
from fuse_cli.toolkit.attention_proofs import (grouped_heads, key_t_decline, merge_decline, merged_rows,
                                               read_outside, scale_decline, scale_of, softcap_of, split_of)
from fuse_cli.toolkit.runtime_shapes import unnamed_like_the_original, unnamed_where_it_was
from fuse_cli.toolkit.shapes import same_dim
from fuse_cli.toolkit.standard_attention import attn_mask_decline, clamped_mask, softcap_decline


@register
class FuseStandardAttention(PatternPass):
    """y = merge_heads(softmax(Q repeat_kv(K)^T * scale + mask) repeat_kv(V)), K = Concat(past_key, K_new) or K_new

      q [B, S, H*d]  ─ Reshape[0,0,H,d] ─ Transpose[0,2,1,3] ──────────────────────────────────────┐
      k [B, S, KV*d] ─ Reshape ─ Transpose ─ (Concat(past_key, ., axis 2) = present_key) ─ repeat_kv ─ K^T ─ MatMul
        ─ (*c) ─ (Add(mask)) ─ Softmax ─ MatMul ─ Transpose[0,2,1,3] ─ Reshape[0,0,H*d] ─ y
      v [B, S, KV*d] ─ Reshape ─ Transpose ─ (Concat(past_value, ., axis 2) = present_value) ─ repeat_kv ┘
        =>  Attention(q, k, v, attn_mask=mask, past_key, past_value; q_num_heads=H, kv_num_heads=KV, scale,
                      softcap)
              -> y, present_key, present_value

    The 3-D form: Q/K/V in their projected [B, S, heads*d] form (standard-rotary-embedding leaves
    them so), grouped by kv_num_heads (head h reads K/V head h // (H/KV), which is repeat_kv's
    row-major merge), so neither the repeated copies nor the scores [B, H, S, T] are written. A
    decode step's cache Concat becomes the operator's past inputs and present outputs. The
    graph's own additive mask (causal with the past's offset, padding; [B or 1, 1 or H, S, T]) is
    passed as attn_mask with is_causal=0, so whatever mask the graph computes stays exact, clamped
    to -1e30 from below (toolkit.standard_attention.MASK_FLOOR: exact for finite masks; a row
    masked throughout with -inf, NaN or zeros in the graph, becomes uniform; a float16 mask is
    widened to float32 first, as onnxruntime's CPU provider runs the graph's masked softmax). A
    prefill whose K/V heads are graph outputs keeps their Reshape + Transpose (ONNX allows present
    outputs only with past inputs). onnxruntime's CPU kernel: float32, float16; its float64 is
    the function body, not a kernel (targets.STANDARD). dynamo's SDPA forms (d^-1/4 on Q and K^T,
    K^T through a batch-flattened view, Where(IsNaN(p), 0, p)) are matched too; the NaN guard is
    the identity on finite inputs. Where the mask or K/V was shaped at run time, the output is
    read through Reshape(y, Shape(y)), as unnamed to onnxruntime's planner as the replaced
    subgraph's (toolkit.runtime_shapes; the opset-17 Llama prefill at batch 64 x 64 estimated 28.6
    MiB fused against the original's 27.7 without it).
    """

    name = "standard-attention"
    description = "Fuse decoder attention (grouped K/V, KV cache, mask) into the standard Attention (opset 23)"
    label = "attention -> Attention (opset 23)"
    emits = ("Attention",)
    min_opset = 23
    keeps = ("key_cache", "value_cache", "key_heads", "value_heads")
    pattern = DECODER

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        grouped = grouped_heads(m, g)
        if isinstance(grouped, Decline):
            return grouped
        h, kv, d = grouped
        if decline := (_cache_decline(m, g, kv, d) or merge_decline(m, g, h * d, rows=True) or scale_decline(m)
                       or key_t_decline(m, g, d)):
            return decline
        if decline := softcap_decline(m, g):
            return decline
        total = g.shape(m.node("context").inputs[1])  # V as read: [B, H, T, d]
        return attn_mask_decline(m, g, h, None if total is None else total.dims[2])

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        (h, d), (kv, _) = split_of(m, g, "query"), split_of(m, g, "key")
        attrs = {"q_num_heads": h, "kv_num_heads": kv, "is_causal": 0}
        scale = scale_of(m)  # float64 product, rounded once into the attribute
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        if (cap := softcap_of(m)) is not None:
            attrs["softcap"] = cap  # applied to the scaled scores before attn_mask, as the graph does
        nodes: list[gs.Node] = []
        mask = clamped_mask(m, g, nodes)
        inputs = [m.tensor("query"), m.tensor("key"), m.tensor("value"),
                  mask if mask is not None else gs.Variable.empty()]
        final = m.root.outputs[0]
        unnamed = unnamed_where_it_was([*inputs[:3], m.tensor("mask")], final)
        y = written = g.variable(f"{m.root.name}_attention_named") if unnamed else final
        if merged_rows(m, h * d):  # [B, S, H*d], then the rows the graph's merge made
            y = g.variable(f"{m.root.name}_attention_out", like=m.tensor("query"))
            nodes.append(g.node("Reshape", [y, m.tensor("merge_shape")], name=f"{m.root.name}_rows", outputs=[written]))
        outputs = [y]
        if "key_cache" in m.nodes:
            inputs += [m.tensor("key_past"), m.tensor("value_past")]
            outputs += [m.node(f"{role}_cache").outputs[0] for role in ("key", "value")]
        for role in ("key", "value"):  # new heads read elsewhere (a prefill's present): computed as the graph did
            split, heads = m.node(f"{role}_split"), m.node(f"{role}_heads")
            if read_outside(heads.outputs[0], m, g):
                out = g.variable(f"{split.name}_out", like=m.tensor(role))
                nodes += [g.node("Reshape", [m.tensor(role), split.inputs[1]], split.attrs, name=split.name,
                                 outputs=[out]),
                          g.node("Transpose", [out], heads.attrs, name=heads.name, outputs=heads.outputs[:1])]
        nodes.append(g.node("Attention", inputs, attrs, name=f"{m.node('softmax').name}_attention", outputs=outputs))
        if unnamed:
            nodes += unnamed_like_the_original(written, final, g, m.root.name)
        return Replacement(nodes=nodes)


def _cache_decline(m: Match, g: GraphEditor, kv: int, d: int) -> Decline | None:
    """Both K and V cached or neither; the past is [B, KV, P, d] of the new tokens' batch, one P for K and V."""
    cached = [role for role in ("key", "value") if f"{role}_cache" in m.nodes]
    if len(cached) == 1:
        return Decline(f"only the {cached[0]} is concatenated to a past: Attention takes past key and value together")
    if not cached:
        return None
    q = g.shape(m.tensor("query"))
    pk, pv = g.shape(m.tensor("key_past")), g.shape(m.tensor("value_past"))
    if (pk is None or pv is None or pk.rank != 4 or pv.rank != 4 or pk.static(1) != kv or pv.static(1) != kv
            or pk.static(3) != d or pv.static(3) != d or not same_dim(pk.dims[0], q.dims[0])
            or not same_dim(pv.dims[0], q.dims[0]) or not same_dim(pk.dims[2], pv.dims[2])):
        return Decline(f"the past {m.tensor('key_past').name!r} {pk and list(pk.dims)} and "
                       f"{m.tensor('value_past').name!r} {pv and list(pv.dims)} are not provably [batch, {kv}, "
                       f"past length, {d}] with one past length")
    return None
