"""Fold a BatchNormalization after a Gemm or MatMul (BatchNorm1d after Linear) into the weights."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.toolkit.conv_weights import batchnorm_affine, batchnorm_reason, bn_params_reason
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register

GEMM_DTYPES = (np.float16, np.float32, np.float64)


@register
class FoldBatchNormIntoLinear(PatternPass):
    """BatchNormalization on the [M, N] output of a Gemm or rank-2 MatMul folds into a Gemm:

        x ── Gemm(W, C, alpha, beta, transA, transB) ── BatchNormalization(gamma, beta_bn, mean, var) ── y
        x ── MatMul(W) ── BatchNormalization(gamma, beta_bn, mean, var) ── y
          =>  x ── Gemm(W', C', alpha=1, beta=1, transA, transB) ── y

        s = gamma / sqrt(var + eps),  t = beta_bn - mean * s
        W' = alpha * W * s  on the N axis (columns of W[K,N]; rows of W[N,K] when transB=1)
        C' = beta * C * s + t   (C = 0 when absent; C of shape [M,N] or [M,1] gives an [M,N] C')

    BN's channel axis is 1, which is the feature axis N only for a rank-2 output: a rank-3 MatMul
    output [B, T, N] is normalized over T, which does not fold. A bias-free MatMul becomes a Gemm
    rather than MatMul + Add: one node, a standard operator with a bias input since opset 7, and
    what matmul-add would turn MatMul + Add into anyway. Computed in float64, rounded once.
    """

    name = "matmul-bn"
    description = "Fold BatchNormalization after Gemm or rank-2 MatMul (BatchNorm1d after Linear) into a Gemm"
    label = "Gemm/MatMul + BatchNormalization"
    min_opset = 7  # Gemm's C broadcasts unidirectionally from opset 7
    pattern = Op("BatchNormalization",
                 Alt(Op("Gemm", Var("x"), Var("weight", const=True), Var("c", const=True, optional=True),
                        name="linear"),
                     Op("MatMul", Var("x"), Var("weight", const=True), name="linear")),
                 Var("scale", const=True), Var("beta", const=True), Var("mean", const=True),
                 Var("variance", const=True), name="bn")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        bn, linear = m.node("bn"), m.node("linear")
        reason = batchnorm_reason(bn, g)
        if reason:
            return reason
        w = constant_value(m.tensor("weight"))
        if w.dtype.type not in GEMM_DTYPES:
            return Decline(f"{linear.name}'s weight has dtype {w.dtype}; Gemm is used for float types only")
        if w.ndim != 2:
            return Decline(f"{linear.name}'s weight has rank {w.ndim}; only a [K, N] weight folds into a Gemm")
        if linear.op == "MatMul":
            shape = g.shape(m.tensor("x"))
            if shape is None:
                return Decline(f"the rank of {linear.name}'s input is unknown (the fold needs a rank-2 output)")
            if shape.rank != 2:
                return (Decline(f"{linear.name}'s output has rank {shape.rank}: {bn.name} normalizes its axis 1, "
                        f"not the feature axis {shape.rank - 1} that the weight produces"))
        features = w.shape[0] if linear.attrs.get("transB", 0) else w.shape[1]
        return bn_params_reason(m, bn, features, f"one per output feature of {linear.name}")

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        bn, linear = m.node("bn"), m.node("linear")
        w = constant_value(m.tensor("weight"))
        s, t = batchnorm_affine(m, bn)
        trans_b = int(linear.attrs.get("transB", 0))
        alpha, beta = float(linear.attrs.get("alpha", 1.0)), float(linear.attrs.get("beta", 1.0))
        new_w = alpha * w.astype(np.float64) * (s[:, None] if trans_b else s[None, :])
        c = constant_value(m.tensor("c")) if m.tensor("c") is not None else None
        new_c = t if c is None else beta * c.astype(np.float64) * s + t
        attrs = {"transA": int(linear.attrs.get("transA", 0)), "transB": trans_b, "alpha": 1.0, "beta": 1.0}
        gemm = gs.Node(op="Gemm", name=linear.name if linear.op == "Gemm" else g.unique_name(f"{linear.name}_gemm"),
                       attrs=attrs, outputs=[bn.outputs[0]],
                       inputs=[m.tensor("x"), g.constant(f"{linear.name}_weight_bnfolded", new_w.astype(w.dtype)),
                               g.constant(f"{linear.name}_bias_bnfolded", new_c.astype(w.dtype))])
        return Replacement(nodes=[gemm])
