"""A RotaryEmbedding on split heads [B, H, S, d] moves onto the [B, S, H*d] projection it was split from."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, kept
from fuse_cli.match import Alt, Match, Op, Var
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.heads import head_split

MS = "com.microsoft"
HEADS_PERM = [0, 2, 1, 3]


def _split() -> Op:
    return Op("Reshape", Var("x3"), Var("split_shape"), name="split")


def _rotary_on_heads(domain: str, head_norm: str, *rest: Var) -> Op:
    """RotaryEmbedding(Transpose(split or head_norm(split)), *rest) in `domain`; rest: its other inputs."""
    return Op("RotaryEmbedding",
              Op("Transpose", Alt(Op(head_norm, _split(), Var("norm_scale"), name="head_norm"), _split()),
                 name="heads", perm=HEADS_PERM),
              *rest, domain=domain, name="rotary")


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """A norm between split and Transpose is this pattern only over each head's own axis."""
    return "head_norm" not in m.nodes or m.node("head_norm").attrs.get("axis", -1) in (-1, 3)


@register
class RotaryBeforeHeadSplit(PatternPass):
    """x3 [B, S, H*d] ─ Reshape [B, S, H, d] ─ Transpose[0,2,1,3] ─ RotaryEmbedding(pos, cos, sin) ─ y
        =>  x3 ─ RotaryEmbedding(pos, cos, sin; num_heads=H) ─ Reshape ─ Transpose[0,2,1,3] ─ y

    x3 ─ Reshape [B, S, H, d] ─ norm(axis -1) ─ Transpose ─ RotaryEmbedding ─ y        (Qwen3's q/k norms)
        =>  x3 ─ Reshape ─ norm ─ Reshape [B, S, H*d] ─ RotaryEmbedding(num_heads=H) ─ Reshape ─ Transpose ─ y

    com.microsoft RotaryEmbedding rotates each head of a [B, S, H*d] input (num_heads H) exactly as
    it rotates [B, H, S, d]: position s of head h reads cos/sin row position_ids + s either way, so
    y is the same bit for bit. rotary-embedding emits the 3-D form itself where it finds the head
    split right under x; where something stood in between when it fused (Phi-3's x[..., :d], a
    whole Slice that eliminate-noop-layout removes afterwards) the kernel runs on the split heads
    and the attention patterns, which read Q and K as projections, do not see it. The split is
    redone after the kernel, so the Reshape and Transpose that stay are what attention removes.
    A SimplifiedLayerNormalization over each head's last axis between split and Transpose (Qwen3
    normalizes each head's Q and K) stays on the heads; its [B, S, H, d] output is viewed as
    [B, S, H*d] (Reshape [0, 0, -1], no copy) for the kernel, which the attention patterns then
    read as the projection they expect.
    """

    name = "rotary-before-head-split"
    description = "Move a RotaryEmbedding on split heads [B, H, S, d] onto the [B, S, H*d] projection"
    label = "RotaryEmbedding on heads -> on the projection"
    emits = ("com.microsoft::RotaryEmbedding",)
    pattern = _rotary_on_heads(MS, "SimplifiedLayerNormalization", Var("position_ids"), Var("cos"), Var("sin"))

    requires = (Requirement(
        "A norm between split and Transpose is this pattern only over each head's own axis.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        split = m.node("split")
        if head_split(split, g) is None:
            shape = g.shape(m.tensor("x3"))
            return Decline(f"{split.name} does not provably split {m.tensor('x3').name!r} "
                           f"({shape and list(shape.dims)}) into [batch, sequence, heads, head_size]")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        split, transpose, rotary, x3 = m.node("split"), m.node("heads"), m.node("rotary"), m.tensor("x3")
        heads, d = head_split(split, g)
        attrs = {**rotary.attrs, "num_heads": heads,
                 "rotary_embedding_dim": rotary.attrs.get("rotary_embedding_dim") or d}
        rotated = g.variable(f"{rotary.name}_projection", like=x3)
        rotated.shape = list(g.shape(x3).dims)  # what later passes of this run read (the tables predate it)
        split_out = g.variable(f"{rotary.name}_split", like=x3)
        split_out.shape = list(g.shape(split.outputs[0]).dims)
        source, kept_nodes = x3, []
        if "head_norm" in m.nodes:  # the norm stays on the heads; the kernel reads its output as [B, S, H*d]
            norm = m.node("head_norm")
            source = g.variable(f"{norm.name}_projection", like=x3)
            source.shape = list(g.shape(x3).dims)
            flat = g.constant(f"{norm.name}_projection_shape", np.array([0, 0, -1], np.int64))
            kept_nodes = [kept(split), kept(norm), gs.Node("Reshape", g.unique_name(f"{norm.name}_projection"), {},
                                                           [norm.outputs[0], flat], [source])]
        return Replacement(nodes=[
            *kept_nodes,
            gs.Node("RotaryEmbedding", g.unique_name(rotary.name), attrs, [source, *rotary.inputs[1:]], [rotated],
                    domain=rotary.domain),
            gs.Node("Reshape", g.unique_name(f"{rotary.name}_split"), dict(split.attrs), [rotated, split.inputs[1]],
                    [split_out]),
            gs.Node("Transpose", g.unique_name(f"{rotary.name}_heads"), dict(transpose.attrs), [split_out],
                    [rotary.outputs[0]]),
        ])


@register
class StandardRotaryBeforeHeadSplit(RotaryBeforeHeadSplit):
    """The same move for ONNX's standard RotaryEmbedding (opset 23), whose 3-D input [B, S, H*d]
    with num_heads H rotates each head as its 4-D [B, H, S, d] input does (cos/sin caches [B, S,
    d/2] either way, no position_ids: standard-rotary-embedding's form), and a standard
    RMSNormalization over each head as the norm between split and Transpose (Qwen3's; Phi-3's
    whole-Slice form too). standard-attention then reads Q and K as projections.
    """

    name = "standard-rotary-before-head-split"
    description = "Move a standard RotaryEmbedding on split heads [B, H, S, d] onto the [B, S, H*d] projection"
    label = "RotaryEmbedding (opset 23) on heads -> on the projection"
    emits = ("RotaryEmbedding",)
    min_opset = 23
    pattern = _rotary_on_heads("", "RMSNormalization", Var("cos"), Var("sin"))
    # standard-rotary-embedding sizes the caches' batch with Shape(heads)[0:1], which the rewrite
    # points at the projection: the same dim 0 (head_split proves the split keeps it)
    keeps = ("heads",)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        heads = m.node("heads")
        for reader in g.outside_readers(heads.outputs[0], m):
            if not _reads_batch(reader):
                return Decline(f"{heads.name}'s output {heads.outputs[0].name!r} is also read by {reader.name}")
        return super().check(m, g)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        heads = m.node("heads")
        for reader in g.outside_readers(heads.outputs[0], m):  # check allowed only Shape[0:1]: same values
            reader.inputs[0] = m.tensor("x3")
        return super().rewrite(m, g)


def _reads_batch(node: gs.Node) -> bool:
    """node is Shape(x)[0:1]: x's dim 0 alone."""
    return node.op == "Shape" and node.attrs.get("start", 0) == 0 and node.attrs.get("end") == 1
