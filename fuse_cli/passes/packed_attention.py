"""Self-attention's three projections and MultiHeadAttention -> the packed-QKV com.microsoft Attention."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register

MS = "com.microsoft"
ROLES = ("query", "key", "value")


def projection(role: str) -> Op:
    return Op("MatMul", Var(f"{role}_input"), Var(f"{role}_weight", const=True), name=f"{role}_projection")


@register
class PackQkvAttention(PatternPass):
    """y = MultiHeadAttention(x·Wq, x·Wk, x·Wv, bias, attention_bias) = Attention(x, [Wq|Wk|Wv], bias, attention_bias)

      x ─┬─ MatMul(Wq) ─┐
         ├─ MatMul(Wk) ─┼─ MultiHeadAttention(bias, attention_bias; num_heads, scale) ─ y
         └─ MatMul(Wv) ─┘
        =>  x ─ Attention([Wq|Wk|Wv], bias, attention_bias; num_heads, scale) ─ y

    The attention pass leaves self-attention (BERT's encoder) as three MatMuls feeding
    MultiHeadAttention; onnxruntime's packed Attention does the three projections as one GEMM
    against the concatenated weights and takes the same [q|k|v] bias, scale and attention_bias
    (added to the scores the same way), so y is the same computation. It measured 0.91-0.97x the
    CPU time of the MatMuls and MultiHeadAttention it replaces, at graph optimization disabled
    and all, and a lower peak on BERT-small and BERT-base layers (no q/k/v tensors between them;
    benchmarks/results/bert_packed_attention.md). Not everywhere: its [B, S, 3D] projection
    scratch can outweigh them (the 64-wide transformer sample at batch 1: 448 against 384 KiB);
    the peak guard holds the result to the original's peak. The weights must be constant (they are
    concatenated once) and
    the three projections must read one input: cross-attention keeps MultiHeadAttention. Q and K
    are as wide as each other (the kernel's rule); V may differ (qkv_hidden_sizes).

    Without a bias (bias-free projections, or zero biases eliminate-noop-arith removed) the
    Attention gets a zero one: onnxruntime-gpu 1.31.1's CPU kernel crashes without its bias input
    (kernel_contracts.py). With it, 0.98-0.99x the MatMuls and MultiHeadAttention at BERT-base's
    [1, 128, 768] and 0.88x at [1, 128, 256], 1.05x at [8, 128, 768] (one thread, 2026-12-05,
    benchmarks/bias_free_attention.py): about what the biased form measured, so it is kept.
    """

    name = "packed-attention"
    description = "Fuse self-attention's Q/K/V MatMuls and MultiHeadAttention into the packed-QKV Attention"
    label = "Q/K/V MatMuls + MultiHeadAttention -> Attention"
    emits = ("com.microsoft::Attention",)
    pattern = Op("MultiHeadAttention", *(projection(r) for r in ROLES), Var("bias", optional=True),
                 Var("key_padding_mask", optional=True), Var("attention_bias", optional=True), domain=MS,
                 name="attention")

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node | None]:
        return g.dtype(m.tensor("query_input")), m.node("attention")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x, attention = m.tensor("query_input"), m.node("attention")
        if m.tensor("key_input") is not x or m.tensor("value_input") is not x:
            return Decline(f"{attention.name}'s key and value are not projections of its query's input "
                           f"{x.name!r} (cross-attention): the packed Attention projects one input")
        if m.tensor("key_padding_mask") is not None:
            return Decline(f"{attention.name} has a key_padding_mask, which the packed Attention reads otherwise")
        if len(attention.outputs) > 1:
            return Decline(f"{attention.name} has present or qk outputs, which the packed Attention does not write")
        shape = g.shape(x)
        if shape is None or shape.rank != 3:
            return Decline(f"{x.name!r} has shape {shape and list(shape.dims)}: the packed Attention takes a "
                           f"[batch, sequence, hidden] input")
        weights = [g.shape(m.tensor(f"{r}_weight")) for r in ROLES]
        if any(w is None or w.rank != 2 or w.dims[0] != shape.dims[2] for w in weights):
            return Decline(f"the projection weights {[w and list(w.dims) for w in weights]} are not all "
                           f"[{shape.dims[2]}, width] matrices")
        if weights[0].dims[1] != weights[1].dims[1]:
            return Decline(f"the query and key projections differ in width ({weights[0].dims[1]} and "
                           f"{weights[1].dims[1]}); the packed Attention needs them equal")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        attention = m.node("attention")
        weights = [constant_value(m.tensor(f"{r}_weight")) for r in ROLES]
        packed = g.constant(f"{attention.name}_qkv_weight", np.concatenate(weights, axis=1))
        attrs = dict(attention.attrs)
        widths = [int(w.shape[1]) for w in weights]
        if widths[2] != widths[0]:
            attrs["qkv_hidden_sizes"] = widths
        bias = m.tensor("bias") or g.constant(f"{attention.name}_qkv_bias", np.zeros(sum(widths), weights[0].dtype))
        inputs = [m.tensor("query_input"), packed, bias, gs.Variable.empty(), gs.Variable.empty(),
                  m.tensor("attention_bias") or gs.Variable.empty()]
        return Replacement(nodes=[g.node("Attention", inputs, attrs, name=f"{attention.name}_packed",
                                         outputs=[attention.outputs[0]], domain=MS)])
