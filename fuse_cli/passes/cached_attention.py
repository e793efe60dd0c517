"""Attention over K/V the graph already holds as heads [B, H, T, d] (a decoder's KV cache:
Concat(past, new), repeated by repeat_kv or not) -> com.microsoft MultiHeadAttention. The pattern
and its proofs are the toolkit's (attention_forms.OVER_HEADS, attention_proofs)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.attention_forms import OVER_HEADS
from fuse_cli.toolkit.attention_proofs import (held_heads, key_t_decline, mask_fits, merge_decline, merged_rows,
                                               scale_decline, scale_of, split_of)
from fuse_cli.toolkit.heads import softmax_key_axis_decline
from fuse_cli.toolkit.query_groups import grouped_attention
from fuse_cli.toolkit.runtime_shapes import shaped_at_run_time, unnamed_like_the_original, unnamed_where_it_was


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
    inputs then), so the Concat stays and its output is read, not rebuilt; the scores and
    probabilities [B, H, S, T] are never written. K/V repeated by repeat_kv are read unrepeated,
    by one node per member of the query groups (toolkit.query_groups: the repeat's copies beside
    the kernel's scratch raised the peak above the unfused graph's); another repeat, or a mask per
    head, keeps one node over the repeated K/V. The graph's own mask (causal with the
    past's offset, padding) is passed unchanged as attention_bias, [B or 1, 1 or H, S, T] by the
    inferred shapes, so whatever mask the graph computes stays exact. GroupQueryAttention would
    take the unrepeated cache, but onnxruntime 1.31's CPU kernel refuses a past with batch > 1 and
    sequence > 1 ("batch_size must be 1 when sequence_length > 1 and past context is given"),
    which symbolic dims cannot rule out. Runs after group-query-attention and attention, which
    fuse the prefill forms whose K/V come straight from a projection. Where the mask or K/V was
    shaped at run time, the output is read through Reshape(y, Shape(y)) (toolkit.runtime_shapes:
    the opset-17 Llama decode step at batch 16, 128 + 128 positions measured 25.4 MiB unfused,
    33.1 fused without it, 25.0 with it).
    """

    name = "cached-attention"
    description = "Fuse attention over K/V heads the graph holds (a KV cache's present) into MultiHeadAttention"
    label = "attention over cached K/V -> MultiHeadAttention"
    emits = ("com.microsoft::MultiHeadAttention",)
    min_opset = 8
    pattern = OVER_HEADS

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
            return decline
        if "softcap" in m.nodes:
            return Decline(f"the scores are soft-capped ({m.node('softcap_tanh').name}: tanh(s / c) * c, as Gemma2's): "
                           "MultiHeadAttention has no soft cap, and GroupQueryAttention's, over a past, runs on the "
                           "CPU only at batch 1 or sequence 1, which the graph's symbolic dims do not promise")
        heads = held_heads(m, g)
        if isinstance(heads, Decline):
            return heads
        h, d, kv = heads
        if kv == h and any(f"{role}_repeat" in m.nodes for role in ("key", "value")):
            return Decline(f"the K/V already have {h} heads and are repeated: MultiHeadAttention takes K/V of {h} "
                           f"heads, or both repeated to {h} by repeat_kv")
        if decline := key_t_decline(m, g, d) or merge_decline(m, g, h * d, rows=True) or scale_decline(m):
            return decline
        k = g.shape(m.tensor("key"))
        mask = m.tensor("mask")
        if mask is not None and not mask_fits(m, g, h, k.dims[2]):
            shape = g.shape(mask)
            return Decline(f"the mask {mask.name!r} of shape {shape and list(shape.dims)} is not provably "
                           f"[batch or 1, 1 or {h}, sequence, key length] of the query's dtype (attention_bias)")
        if mask is not None and kv != h and not mask_fits(m, g, 1, k.dims[2]):
            return Decline(f"the mask {mask.name!r} differs per head: the query groups' nodes over the {kv} K/V heads "
                           f"take one mask for all (MultiHeadAttention over the repeated K/V instead)")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        h, d = split_of(m, g, "query")
        kv = g.shape(m.tensor("key")).static(1)
        attrs = {"num_heads": h}
        scale = scale_of(m)  # float64 product, rounded once into the attribute
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        inputs = [m.tensor("query"), m.tensor("key"), m.tensor("value")]
        mask = [gs.Variable.empty(), gs.Variable.empty(), m.tensor("mask")] if m.tensor("mask") is not None else []
        base, out = m.node("softmax").name, m.root.outputs[0]
        if kv != h:
            return Replacement(nodes=grouped_attention(
                *inputs, mask, attrs, (h, kv, d), out, m.tensor("merge_shape") if merged_rows(m, h * d) else None,
                shaped_at_run_time(inputs + mask), g, base))
        inputs += mask
        if not merged_rows(m, h * d):
            if not unnamed_where_it_was(inputs, out):
                return Replacement(nodes=[gs.Node("MultiHeadAttention", g.unique_name(f"{base}_mha"), attrs, inputs,
                                                  [out], domain="com.microsoft")])
            y = g.variable(f"{base}_mha_out")
            return Replacement(nodes=[gs.Node("MultiHeadAttention", g.unique_name(f"{base}_mha"), attrs, inputs, [y],
                                              domain="com.microsoft"), *unnamed_like_the_original(y, out, g, base)])
        y = g.variable(f"{base}_mha_out")  # [B, S, H*d], then the rows the graph's merge made
        return Replacement(nodes=[
            gs.Node("MultiHeadAttention", g.unique_name(f"{base}_mha"), attrs, inputs, [y], domain="com.microsoft"),
            gs.Node("Reshape", g.unique_name(f"{base}_rows"), {}, [y, m.tensor("merge_shape")], [out])])
