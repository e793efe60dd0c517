"""Attention over K/V the graph already holds as heads [B, KV, T, d] (an encoder-decoder's cross-
attention over the cached encoder K/V; a cache's present) -> ONNX's standard Attention (opset 23)
on 4-D inputs. The pattern and its proofs are the toolkit's (attention_forms.OVER_HEADS,
attention_proofs), which cached-attention shares."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, kept
from fuse_cli.match import Match
from fuse_cli.toolkit.standard_attention import attn_mask_decline, clamped_mask, softcap_decline
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.attention_forms import OVER_HEADS
from fuse_cli.toolkit.attention_proofs import (held_heads, key_t_decline, merge_decline, scale_decline,
                                               scale_of, softcap_of, split_of)
from fuse_cli.toolkit.heads import softmax_key_axis_decline
from fuse_cli.toolkit.runtime_shapes import unnamed_like_the_original, unnamed_where_it_was


@register
class FuseStandardCachedAttention(PatternPass):
    """y = merge_heads(softmax(split(Q) K^T * scale + mask) V), K and V given as heads [B, KV, T, d]

      q [B, S, H*d] ─ Reshape[0,0,H,d] ─ Transpose[0,2,1,3] ─┐
      K [B, KV, T, d] (repeat_kv'd to H heads, or H heads) ─ Transpose ─ MatMul ─ (*c) ─ (Add(mask))
        ─ Softmax ─ MatMul ─ Transpose[0,2,1,3] ─ Reshape[0,0,H*d] ─ y
      V [B, KV, T, d] ─────────────────────────────────────────────┘
        =>  Attention(split(q) [B, H, S, d], K, V, attn_mask=mask; scale) ─ Transpose ─ Reshape ─ y

    Whisper's cross-attention reads the encoder's K/V as cached inputs, never split from a
    projection in the graph, which standard-attention's pattern needs. The standard operator takes
    Q, K and V all 4-D (onnxruntime refuses a 3-D Q with 4-D K/V: benchmarks/opset23_probe.py), so
    Q stays split into heads and the graph's merge follows the operator; with 4-D inputs the heads
    are read off the shapes, H query heads over KV K/V heads, each K/V head serving H/KV queries in
    a row, which is repeat_kv's order: repeated K/V are read unrepeated. The mask as in
    standard-attention: [B or 1, 1 or H, S, T], float32 (float16 widened to it), clamped to its MASK_FLOOR.
    Runs after standard-attention, which takes the forms whose K/V come from a projection.
    """

    name = "standard-cached-attention"
    description = "Fuse attention over K/V heads the graph holds (cross-attention, a cache) into the standard Attention"
    label = "attention over held K/V -> Attention (opset 23)"
    emits = ("Attention",)
    min_opset = 23
    pattern = OVER_HEADS

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
            return decline
        if decline := softcap_decline(m, g):
            return decline
        heads = held_heads(m, g)
        if isinstance(heads, Decline):
            return heads
        h, d, _ = heads
        if decline := key_t_decline(m, g, d) or merge_decline(m, g, h * d, rows=False) or scale_decline(m):
            return decline
        return attn_mask_decline(m, g, h, g.shape(m.tensor("key")).dims[2])

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        _, d = split_of(m, g, "query")
        attrs = {"is_causal": 0}
        scale = scale_of(m)  # float64 product, rounded once into the attribute
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        if (cap := softcap_of(m)) is not None:
            attrs["softcap"] = cap
        base = m.node("softmax").name
        split, heads = kept(m.node("query_split")), kept(m.node("query_heads"))
        nodes = [split, heads]
        mask = clamped_mask(m, g, nodes)
        inputs = [heads.outputs[0], m.tensor("key"), m.tensor("value"), *([mask] if mask is not None else [])]
        context = g.variable(f"{base}_attention_out", like=m.tensor("query"))
        nodes.append(gs.Node("Attention", g.unique_name(f"{base}_attention"), attrs, inputs, [context]))
        merged = g.variable(f"{base}_attention_merged", like=m.tensor("query"))
        transpose = m.node("merge_transpose")
        nodes.append(gs.Node("Transpose", g.unique_name(transpose.name), dict(transpose.attrs), [context], [merged]))
        final = m.root.outputs[0]
        unnamed = unnamed_where_it_was([m.tensor("query"), m.tensor("key"), m.tensor("value"), m.tensor("mask")], final)
        written = g.variable(f"{base}_attention_named") if unnamed else final
        nodes.append(gs.Node("Reshape", g.unique_name(m.root.name), dict(m.root.attrs),
                             [merged, m.tensor("merge_shape")],
                             [written]))
        if unnamed:
            nodes += unnamed_like_the_original(written, final, g, base)
        return Replacement(nodes=nodes)
