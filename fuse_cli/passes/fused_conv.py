"""Conv + activation (optionally after a residual Add) -> onnxruntime's FusedConv."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activations import gates_itself, schema_attribute
from fuse_cli.toolkit.quantized import TO_ONNXRUNTIME, qdq_unit_reason

MS = "com.microsoft"
# activation -> the attributes FusedConv's activation_params carries, in order (contrib_ops/cpu/fused_activation.cc)
PARAMS = {"Relu": (), "Sigmoid": (), "Tanh": (), "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"),
          "Clip": ("min", "max")}
CONV = Op("Conv", Var("x"), Var("w"), Var("b", optional=True), name="conv")


@register
class FuseConvActivation(PatternPass):
    """y = act(Conv(x, W, B) [+ Z])  =>  FusedConv(x, W, B, Z; activation, activation_params)

        x ── Conv(W, B) ──[ Add(Z) ]── Relu | Clip | LeakyRelu | Sigmoid | Tanh | HardSigmoid ── y
          =>  x ── com.microsoft::FusedConv(W, B?, Z?) ── y

    FusedConv adds Z to the convolution before the activation, with no broadcasting: Z must have
    the Conv output's shape exactly (checked on static shapes). A Conv without bias passes B as an
    empty input when Z follows. Conv's own attributes are kept. activation_params: Clip [min, max]
    (bounds from inputs at opset >= 11, attributes before; an absent bound is -inf/+inf, or the
    schema's +-FLT_MAX for the attribute form); LeakyRelu [alpha]; HardSigmoid [alpha, beta];
    omitted attributes take the schema defaults. A float32 kernel only: float16 where the CPU ran the
    Conv and activation in float32 too (targets.emit_reason). CUDA's kernel takes only Relu
    (contrib_ops/cuda/fused_conv.cc) and runs slower than the unfused pair (targets.SLOWER): declined
    wherever the model may run on CUDA. A Conv inside a QDQ node unit (DequantizeLinear inputs) is
    left to onnxruntime, which makes QLinearConv of DQ -> Conv -> Relu -> Q at ORT_ENABLE_EXTENDED;
    fused, it ran in float: 2.3x the time at [1, 64, 56, 56] (2.28-2.35 in four runs, one thread;
    benchmarks/results/quantized.md). fused-gemm (QGemm) and fused-matmul (MatMulIntegerToFloat)
    leave their units alone for the same reason.
    """

    name = "fused-conv"
    description = "Fuse Conv (+ residual Add) + activation into com.microsoft FusedConv"
    label = "Conv (+ Add) + activation -> FusedConv"
    emits = (f"{MS}::FusedConv",)
    pattern = Op(tuple(PARAMS), Alt(Op("Add", CONV, Var("z"), name="add"), CONV),
                 Var("min", const=True, optional=True), Var("max", const=True, optional=True), name="act")
    requires = (Requirement(
        "The Conv's output does not gate the activation's result (x * relu6(x + 3) / 6, x * sigmoid(x)): "
        "the Conv's output is read again, so it cannot become FusedConv's; silent, not a near-miss beside "
        "the gated activation's own.",
        lambda m, g: not gates_itself(m.node("conv").outputs[0], m.nodes.get("add") or m.node("act"))),)

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        conv = m.node("conv")
        return g.dtype(conv.outputs[0]) or g.dtype(m.tensor("x")), conv

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        act = m.node("act")
        quantized = qdq_unit_reason(m.node("conv"), g, why=TO_ONNXRUNTIME)
        if quantized:
            return quantized
        for role in ("min", "max"):
            bound = constant_value(m.tensor(role))
            if bound is not None and bound.size != 1:
                return Decline(f"{act.name}'s {role} has {bound.size} values, not one")
        if "add" in m.nodes:
            return _residual_reason(m, g)
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        conv, act = m.node("conv"), m.node("act")
        attrs = {**conv.attrs, "activation": act.op}
        params = [_param(m, g, name) for name in PARAMS[act.op]]
        if params:
            attrs["activation_params"] = params
        inputs, bias = [m.tensor("x"), m.tensor("w")], m.tensor("b")
        if m.tensor("z") is not None:  # B is optional: an empty name keeps Z in fourth place
            inputs += [bias if bias is not None else gs.Variable.empty(), m.tensor("z")]
        elif bias is not None:
            inputs.append(bias)
        fused = g.node("FusedConv", inputs, attrs, name=f"{conv.name}_fused", outputs=[act.outputs[0]], domain=MS)
        return Replacement(nodes=[fused])


def _residual_reason(m: Match, g: GraphEditor) -> Decline | None:
    conv, add, z = m.node("conv"), m.node("add"), m.tensor("z")
    if z is conv.outputs[0]:
        return Decline(f"{add.name} adds {conv.name}'s output to itself: there is no separate residual")
    out, residual = g.shape(conv.outputs[0]), g.shape(z)
    if out is None or residual is None or None in out.dims or None in residual.dims:
        return (Decline(f"{add.name}: the shapes of {conv.name}'s output and of the residual {z.name!r} "
                "are not both known; FusedConv needs them equal (no broadcasting)"))
    if out.dims != residual.dims:
        return (Decline(f"{add.name} broadcasts: the residual {z.name!r} has shape {list(residual.dims)}, "
                        f"{conv.name}'s output "
                f"{list(out.dims)}; FusedConv adds Z without broadcasting"))
    return None


def _param(m: Match, g: GraphEditor, name: str) -> float:
    act = m.node("act")
    if act.op == "Clip" and m.tensor(name) is not None:
        return float(constant_value(m.tensor(name)).reshape(-1)[0])
    value = schema_attribute(act, name, g.opset)
    if value is None:  # an absent Clip bound input (opset >= 11) clamps nothing
        return -np.inf if name == "min" else np.inf
    return value


