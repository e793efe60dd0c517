"""Fold an inference-mode BatchNormalization into the unpadded Conv that reads it (input side)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.toolkit.conv_weights import (FOLDABLE_DTYPES, batchnorm_affine, batchnorm_reason, bn_params_reason,
                                           fold_input_affine, refolded_conv)
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register


@register
class FoldBatchNormIntoNextConv(PatternPass):
    """BatchNormalization before a Conv folds into the Conv's input side:

        x ── BatchNormalization(gamma, beta, mean, var, eps) ── Conv(W, b) ── y
          =>  x ── Conv(W', b') ── y

        s = gamma / sqrt(var + eps),  t = beta - mean * s      (BN is x * s + t per channel)
        W'[o,i,k] = W[o,i,k] * s[c]      b'[o] = b[o] + sum over i,k of W[o,i,k] * t[c]
        where c = group(o) * C_in/group + i is the input channel weight W[o,i] reads.

    Exact only when the Conv does not pad (pads all 0, auto_pad NOTSET or VALID): every window
    then lies inside x, so each tap sees s*x + t. With padding, the taps in the border read the
    zeros the Conv pads with, not the t that BN would have added there. ConvTranspose is not
    folded: its output borders receive fewer taps, so t does not contribute a per-channel constant.
    Computed in float64 and rounded once to the weight dtype; new weights, never a shared one mutated.
    A BN that conv-bn can fold into the Conv before it is left to conv-bn, exact at any padding.
    """

    name = "bn-conv"
    description = "Fold BatchNormalization into the following unpadded Conv (input-side)"
    label = "BatchNormalization + Conv"
    pattern = Op("Conv", Op("BatchNormalization", Var("x"), Var("scale", const=True), Var("beta", const=True),
                            Var("mean", const=True), Var("variance", const=True), name="bn"),
                 Var("weight", const=True), Var("bias", const=True, optional=True), name="conv")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        bn, conv = m.node("bn"), m.node("conv")
        reason = batchnorm_reason(bn, g) or _output_side_fold(bn, g)
        if reason:
            return reason
        w = constant_value(m.tensor("weight"))
        if w.dtype.type not in FOLDABLE_DTYPES:
            return Decline(f"{conv.name}'s weight has dtype {w.dtype}, not a float type that can be folded")
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        pads = conv.attrs.get("pads", [])
        if auto_pad not in ("NOTSET", "VALID") or (auto_pad == "NOTSET" and any(pads)):
            padding = f"auto_pad={auto_pad}" if auto_pad != "NOTSET" else f"pads={list(pads)}"
            return (Decline(f"{conv.name} pads its input ({padding}): its zero padding of {bn.name}'s output is not "
                    f"the shift {bn.name} adds, so the fold would be wrong at the borders"))
        channels = w.shape[1] * int(conv.attrs.get("group", 1))
        reason = bn_params_reason(m, bn, channels, f"one per input channel of {conv.name}")
        if reason:
            return reason
        bias = m.tensor("bias")
        if bias is not None and constant_value(bias).size != w.shape[0]:
            return Decline(f"{conv.name}'s bias has {constant_value(bias).size} values "
                           f"for {w.shape[0]} output channels")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn, conv = m.node("bn"), m.node("conv")
        w = constant_value(m.tensor("weight"))
        s, t = batchnorm_affine(m, bn)
        new_w, shift = fold_input_affine(conv, w.astype(np.float64), s, t)
        b = constant_value(m.tensor("bias")).astype(np.float64) if m.tensor("bias") is not None else 0.0
        inputs = [m.tensor("x"), g.constant(f"{conv.name}_weight_bnfolded", new_w.astype(w.dtype)),
                  g.constant(f"{conv.name}_bias_bnfolded", (b + shift).astype(w.dtype))]
        return Replacement(nodes=[refolded_conv(conv, inputs, conv.outputs[0])])


def _output_side_fold(bn: gs.Node, g: GraphEditor) -> Decline | None:
    """conv-bn's case (a Conv with constant weights before the BN, read by nothing else) is
    simpler and exact whatever the padding: leave it that fold, whatever the pipeline order."""
    source = bn.inputs[0]
    producer = source.inputs[0] if len(source.inputs) == 1 else None
    if producer is None or producer.op not in ("Conv", "ConvTranspose") or producer.domain:
        return None
    if len(source.outputs) != 1 or g.is_graph_output(source):
        return None
    if any(constant_value(t) is None for t in producer.inputs[1:3] if t.name):
        return None
    return Decline(f"{bn.name} folds into {producer.name} before it instead (conv-bn)")
