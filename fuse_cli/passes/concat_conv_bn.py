"""Fold a BatchNormalization after a channel Concat of Convs into each of those Convs."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Alt, Match, Op, Var, constant_value, variadic
from fuse_cli.toolkit.conv_weights import (FOLDABLE_DTYPES, batchnorm_affine, batchnorm_reason, bn_params_reason,
                                           output_channels, refolded_conv, scale_output_channels)
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register

MAX_INPUTS = 32  # Concat is variadic and the matcher's Op has a fixed arity: one option per count


def _conv(i: int) -> Op:
    return Op(("Conv", "ConvTranspose"), Var(f"x{i}"), Var(f"weight{i}", const=True),
              Var(f"bias{i}", const=True, optional=True), name=f"conv{i}")


# Every Concat input a Conv (tried first), else any Concat, so the check can name the input that
# is not a Conv; listing per-input alternatives instead would backtrack through 2^n matches.
ALL_CONVS = tuple(Op("Concat", *(_conv(i) for i in range(n)), name="concat")
                  for n in range(1, MAX_INPUTS + 1))
ANY_CONCAT = variadic("Concat", "concat", MAX_INPUTS)


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """A Concat with an input no Conv computes (DenseNet's pooled features) is not this
    pattern: silent. The any-Concat form is kept only to explain Convs that do not fit."""
    return "conv0" in m.nodes or all(_conv_output(t) for t in m.node("concat").inputs)


@register
class FoldBatchNormIntoConcatenatedConvs(PatternPass):
    """BatchNormalization over a channel Concat of Convs folds into each Conv; the Concat stays:

        x0 ── Conv0(W0, b0) ──┐
        x1 ── Conv1(W1, b1) ──┼── Concat(axis=1) ── BatchNormalization(gamma, beta, mean, var) ── y
        x2 ── Conv2(W2, b2) ──┘
          =>  xk ── Convk(Wk', bk') ── Concat(axis=1) ── y

    BN acts per channel, and channel c of the Concat is channel c - offset_k of Conv k, so the
    BN parameters split into consecutive segments of each Conv's output-channel count and fold
    as in conv-bn: s = gamma / sqrt(var + eps), Wk' = Wk * s_k on the output-channel axis,
    bk' = (bk - mean_k) * s_k + beta_k. Every Concat input must be a Conv/ConvTranspose output
    read by nothing else (the engine checks), and the axis must be the channel axis.
    """

    name = "concat-conv-bn"
    description = "Fold BatchNormalization after a channel Concat of Convs into each Conv"
    label = "Conv... + Concat + BatchNormalization"
    pattern = Op("BatchNormalization", Alt(*ALL_CONVS, ANY_CONCAT), Var("scale", const=True), Var("beta", const=True),
                 Var("mean", const=True), Var("variance", const=True), name="bn")

    requires = (Requirement(
        "A Concat with an input no Conv computes (DenseNet's pooled features) is not this pattern: silent. "
        "The any-Concat form is kept only to explain Convs that do not fit.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        bn, concat = m.node("bn"), m.node("concat")
        if "conv0" not in m.nodes:
            return _not_all_convs(concat)
        reason = batchnorm_reason(bn, g)
        if reason:
            return reason
        convs = _convs(m)
        weights = [constant_value(m.tensor(f"weight{i}")) for i in range(len(convs))]
        rank = weights[0].ndim
        if int(concat.attrs.get("axis", 0)) % rank != 1:
            return Decline(f"{concat.name} concatenates on axis {concat.attrs.get('axis', 0)}, not the channel axis 1")
        for i, (conv, w) in enumerate(zip(convs, weights)):
            if w.dtype.type not in FOLDABLE_DTYPES:
                return Decline(f"{conv.name}'s weight has dtype {w.dtype}, not a float type that can be folded")
            bias = m.tensor(f"bias{i}")
            if bias is not None and constant_value(bias).size != output_channels(conv, w):
                return (Decline(f"{conv.name}'s bias has {constant_value(bias).size} values for "
                        f"{output_channels(conv, w)} channels"))
        total = sum(output_channels(c, w) for c, w in zip(convs, weights))
        return bn_params_reason(m, bn, total, f"one per channel of {concat.name}'s output")

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn, concat = m.node("bn"), m.node("concat")
        s_all, t_all = batchnorm_affine(m, bn)
        nodes, outputs, offset = [], [], 0
        for i, conv in enumerate(_convs(m)):
            w = constant_value(m.tensor(f"weight{i}"))
            channels = output_channels(conv, w)
            s, t = s_all[offset:offset + channels], t_all[offset:offset + channels]
            offset += channels
            b = constant_value(m.tensor(f"bias{i}")).astype(np.float64) if m.tensor(f"bias{i}") is not None else 0.0
            out = g.variable(f"{conv.name}_out", like=conv.outputs[0])
            new_w = scale_output_channels(conv, w.astype(np.float64), s).astype(w.dtype)
            inputs = [m.tensor(f"x{i}"), g.constant(f"{conv.name}_weight_bnfolded", new_w),
                      g.constant(f"{conv.name}_bias_bnfolded", (b * s + t).astype(w.dtype))]
            nodes.append(refolded_conv(conv, inputs, out))
            outputs.append(out)
        nodes.append(rebuilt(concat, inputs=outputs, outputs=[bn.outputs[0]]))
        return Replacement(nodes=nodes)


def _convs(m: Match) -> list[gs.Node]:
    return [m.nodes[f"conv{i}"] for i in range(MAX_INPUTS) if f"conv{i}" in m.nodes]


def _conv_output(tensor: gs.Tensor) -> bool:
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    return producer is not None and producer.op in ("Conv", "ConvTranspose") and not producer.domain


def _not_all_convs(concat: gs.Node) -> Decline:
    """Why the all-Conv alternative did not fit: always a reason (this match is never rewritten)."""
    seen: list[gs.Tensor] = []
    for tensor in concat.inputs:
        if any(tensor is t for t in seen):
            return Decline(f"{concat.name} reads {tensor.name!r} more than once")
        seen.append(tensor)
    return Decline(f"{concat.name}'s inputs do not all fit Conv(x, W, b?)")
