"""A residual Add feeding a normalization -> onnxruntime's SkipLayerNormalization or
SkipSimplifiedLayerNormalization (one kernel for the sum and the norm)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, any_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activations import bias_reason, bias_tensor
from fuse_cli.toolkit.norms import param_reason, param_tensor
from fuse_cli.toolkit.shapes import dims_list

# Exporters write Linear + residual as Add(Add(MatMul, bias), residual): the bias rides along.
SUM = Alt(Op("Add", Op("Add", Var("input"), Const(any_value, name="bias"), name="add_bias"), Var("skip"),
             name="add"),
          Op("Add", Var("input"), Var("skip"), name="add"))


class _SkipNorm(PatternPass):
    """The checks and the rewrite both skip fusions share; subclasses name the ops."""

    fused_op: ClassVar[str]
    keeps = ("add",)  # the sum, when read elsewhere, becomes the fused op's 4th output

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("input")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        norm, x, skip = m.node("norm"), m.tensor("input"), m.tensor("skip")
        shape, dtype = g.shape(x), g.dtype(x)
        if len([t for t in norm.outputs if t.name]) > 1:
            return Decline(f"{norm.name} also outputs its statistics")
        if shape is None or shape.rank not in (2, 3):
            return Decline(f"{m.node('add').name}'s input has rank {shape and shape.rank}; "
                           f"{self.fused_op} takes rank 2 or 3")
        if g.shape(skip) != shape or None in shape.dims:
            return (Decline(f"{m.node('add').name} adds {skip.name!r} of shape {dims_list(g.shape(skip))} "
                    f"to {x.name!r} of shape {dims_list(shape)}: the shapes must be known and equal"))
        if int(norm.attrs.get("axis", -1)) not in (-1, shape.rank - 1):
            return Decline(f"{norm.name} normalizes from axis {norm.attrs['axis']}; "
                           f"{self.fused_op} normalizes the last only")
        if dtype is None or g.dtype(skip) != dtype:
            return Decline(f"{m.node('add').name} adds {g.dtype(skip)} to {dtype}")
        if dtype != np.float32 and int(norm.attrs.get("stash_type", 1)) != 1:
            return Decline(f"{norm.name} computes in {dtype} (stash_type=0); {self.fused_op} computes in float32")
        return (bias_reason(g, m.tensor("bias"), m.nodes.get("add_bias"), shape, dtype)
                or next(filter(None, (param_reason(g, m.tensor(p), p, norm, shape, shape.rank - 1, dtype)
                                      for p in ("gamma", "beta"))), None))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        norm, add = m.node("norm"), m.node("add")
        shape, dtype = g.shape(m.tensor("input")), g.dtype(m.tensor("input"))
        params = [param_tensor(g, m.tensor("gamma"), "gamma", shape, shape.rank - 1, dtype)]
        beta, bias = m.tensor("beta"), m.tensor("bias")
        if self.fused_op == "SkipLayerNormalization" and (beta is not None or bias is not None):
            params.append(param_tensor(g, beta, "beta", shape, shape.rank - 1, dtype) if beta else gs.Variable.empty())
        if bias is not None:
            params.append(bias_tensor(g, bias, shape.dims[-1]))
        total = add.outputs[0]
        read_elsewhere = g.is_graph_output(total) or any(reader is not norm for reader in total.outputs)
        outputs = [norm.outputs[0]] + ([gs.Variable.empty(), gs.Variable.empty(), total] if read_elsewhere else [])
        node = g.node(self.fused_op, [m.tensor("input"), m.tensor("skip"), *params],
                      {"epsilon": float(norm.attrs.get("epsilon", 1e-5))}, name=f"{norm.name}_skip", outputs=outputs,
                      domain="com.microsoft")
        return Replacement(nodes=[node])


@register
class FuseSkipLayerNormalization(_SkipNorm):
    """y = LayerNorm(input + skip (+ bias)) * gamma + beta over the last axis; sum = input + skip (+ bias)

        input ── Add(bias) ──┐
                    skip ── Add = sum ── LayerNormalization(gamma, beta?, axis=-1, eps) ── y
          =>  SkipLayerNormalization(input, skip, gamma, beta?, bias?, epsilon) ── y (, sum)

    Exact when input and skip have the same known shape of rank 2 or 3 (no broadcasting), the
    bias is a constant over the last axis only, and gamma/beta broadcast over the last axis only.
    epsilon is always written: SkipLayerNormalization's default (1e-12) is not LayerNormalization's
    (1e-5). When the sum is also read elsewhere it becomes the fused op's 4th output.
    """

    name = "skip-layer-norm"
    description = "Fuse a residual Add (+ bias) and LayerNormalization into SkipLayerNormalization"
    label = "Add + LayerNormalization -> SkipLayerNormalization"
    fused_op = "SkipLayerNormalization"
    emits = ("com.microsoft::SkipLayerNormalization",)  # CUDA only: measured slower on the CPU (targets.SLOWER)
    pattern = Op("LayerNormalization", SUM, Var("gamma"), Var("beta", optional=True), name="norm")


@register
class FuseSkipSimplifiedLayerNormalization(_SkipNorm):
    """y = (input + skip (+ bias)) / sqrt(mean(sum^2) + eps) * gamma over the last axis

        input ── Add(bias) ──┐
                    skip ── Add = sum ── SimplifiedLayerNormalization(gamma, axis=-1, eps) ── y
          =>  SkipSimplifiedLayerNormalization(input, skip, gamma, bias?, epsilon) ── y (, sum)

    The norm is what simplified-layer-norm (or rms-norm: RMSNormalization) made of a decomposed
    RMSNorm, so those passes run first. Exact under skip-layer-norm's conditions.
    """

    name = "skip-simplified-layer-norm"
    description = "Fuse a residual Add (+ bias) and an RMSNorm into SkipSimplifiedLayerNormalization"
    label = "Add + RMSNorm -> SkipSimplifiedLayerNormalization"
    fused_op = "SkipSimplifiedLayerNormalization"
    emits = ("com.microsoft::SkipSimplifiedLayerNormalization",)  # CUDA only, as skip-layer-norm
    pattern = Alt(Op("SimplifiedLayerNormalization", SUM, Var("gamma"), name="norm"),
                  Op("RMSNormalization", SUM, Var("gamma"), name="norm"))


