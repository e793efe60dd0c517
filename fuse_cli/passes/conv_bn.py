"""Fold an inference-mode BatchNormalization into the Conv or ConvTranspose that feeds it."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.passes.base import PatternPass
from fuse_cli.passes.registry import register

FOLDABLE_WEIGHT_DTYPES = (np.float16, np.float32, np.float64)


@register
class FoldBatchNormIntoConv(PatternPass):
    """BatchNormalization after Conv/ConvTranspose folds into the weights:

        x ── Conv(W, b) ── BatchNormalization(gamma, beta, mean, var, eps) ── y
          =>  x ── Conv(W', b') ── y

        s  = gamma / sqrt(var + eps)          (eps kept: dropping it is the classic accuracy bug)
        W' = W * s   on the output-channel axis: axis 0 for Conv; for ConvTranspose, whose weight
                     is [C_in, C_out/group, k...], axis 1 within each group
        b' = (b - mean) * s + beta            (b = 0 when the Conv has no bias)

    Computed in float64 and rounded once to the weight dtype, so fp16 weights come out correctly
    rounded. New weight tensors are created: a weight shared with another node is never mutated.
    """

    name = "conv-bn"
    description = "Fold BatchNormalization into the preceding Conv/ConvTranspose weights"
    label = "Conv + BatchNormalization"
    pattern = Op(
        "BatchNormalization",
        Op(("Conv", "ConvTranspose"), Var("x"), Var("weight", const=True),
           Var("bias", const=True, optional=True), name="conv"),
        Var("scale", const=True), Var("beta", const=True), Var("mean", const=True), Var("variance", const=True),
        name="bn",
    )

    def check(self, m: Match, g: GraphEditor) -> str | None:
        bn, conv = m.node("bn"), m.node("conv")
        if bn.attrs.get("training_mode", 0) == 1:
            return f"{bn.name} is in training mode (training_mode=1): its statistics change per batch"
        if g.opset < 7 and bn.attrs.get("is_test", 0) != 1:
            return f"{bn.name} has is_test=0 (training mode before opset 7)"
        if any(out.outputs or g.is_graph_output(out) for out in bn.outputs[1:]):
            return f"{bn.name} exposes running statistics (training-mode outputs are read)"
        if bn.attrs.get("spatial", 1) == 0:
            return f"{bn.name} has spatial=0 (per-activation statistics), which does not fold per channel"
        w = constant_value(m.tensor("weight"))
        if w.dtype.type not in FOLDABLE_WEIGHT_DTYPES:
            return f"{conv.name}'s weight has dtype {w.dtype}, not a float type that can be folded"
        channels = _output_channels(conv, w)
        for role in ("scale", "beta", "mean", "variance"):
            value = constant_value(m.tensor(role))
            if value.size != channels or value.ndim != 1:
                return (f"{bn.name}'s {role} has shape {list(value.shape)}, expected [{channels}] "
                        "(one per output channel)")
        bias = m.tensor("bias")
        if bias is not None and constant_value(bias).size != channels:
            return f"{conv.name}'s bias has {constant_value(bias).size} values for {channels} output channels"
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn, conv = m.node("bn"), m.node("conv")
        w = constant_value(m.tensor("weight"))
        gamma, beta, mean, var = (constant_value(m.tensor(k)).astype(np.float64)
                                  for k in ("scale", "beta", "mean", "variance"))
        scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        bias = constant_value(m.tensor("bias")) if m.tensor("bias") is not None else np.zeros(scale.shape, w.dtype)
        folded_w = _scale_output_channels(conv, w.astype(np.float64), scale).astype(w.dtype)
        folded_b = ((bias.astype(np.float64) - mean) * scale + beta).astype(w.dtype)
        fused = gs.Node(
            op=conv.op,
            name=conv.name,
            domain=conv.domain,
            attrs=dict(conv.attrs),
            inputs=[m.tensor("x"), g.constant(f"{conv.name}_weight_bnfolded", folded_w),
                    g.constant(f"{conv.name}_bias_bnfolded", folded_b)],
            outputs=[bn.outputs[0]],
        )
        return Replacement(nodes=[fused])


def _output_channels(conv: gs.Node, w: np.ndarray) -> int:
    if conv.op == "ConvTranspose":
        return w.shape[1] * int(conv.attrs.get("group", 1))
    return w.shape[0]


def _scale_output_channels(conv: gs.Node, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    spatial = (1,) * (w.ndim - 2)
    if conv.op != "ConvTranspose":
        return w * scale.reshape(-1, 1, *spatial)
    groups = int(conv.attrs.get("group", 1))
    c_in, c_out_per_group = w.shape[0], w.shape[1]
    grouped = w.reshape(groups, c_in // groups, c_out_per_group, *w.shape[2:])
    grouped = grouped * scale.reshape(groups, 1, c_out_per_group, *spatial)
    return grouped.reshape(w.shape)
