"""Fold an inference-mode BatchNormalization into the Conv or ConvTranspose that feeds it."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.conv_weights import (FOLDABLE_DTYPES, batchnorm_affine, batchnorm_reason, bn_params_reason,
                                           conv_bias_reason, output_channels, refolded_conv, scale_output_channels)


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

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        bn, conv = m.node("bn"), m.node("conv")
        w = constant_value(m.tensor("weight"))
        if reason := batchnorm_reason(bn, g):
            return reason
        if w.dtype.type not in FOLDABLE_DTYPES:
            return Decline(f"{conv.name}'s weight has dtype {w.dtype}, not a float type that can be folded")
        channels = output_channels(conv, w)
        return bn_params_reason(m, bn, channels, "one per output channel") or conv_bias_reason(m, conv, channels)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn, conv = m.node("bn"), m.node("conv")
        w = constant_value(m.tensor("weight"))
        scale, shift = batchnorm_affine(m, bn)  # s = gamma / sqrt(var + eps), t = beta - mean * s
        bias = constant_value(m.tensor("bias")) if m.tensor("bias") is not None else np.zeros(scale.shape, w.dtype)
        folded_w = scale_output_channels(conv, w.astype(np.float64), scale).astype(w.dtype)
        folded_b = (bias.astype(np.float64) * scale + shift).astype(w.dtype)  # (b - mean) * s + beta
        inputs = [m.tensor("x"), g.constant(f"{conv.name}_weight_bnfolded", folded_w),
                  g.constant(f"{conv.name}_bias_bnfolded", folded_b)]
        return Replacement(nodes=[refolded_conv(conv, inputs, bn.outputs[0])])
