"""Gemm + activation -> onnxruntime's FusedGemm (CPU provider only)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activations import schema_attribute
from fuse_cli.toolkit.quantized import TO_ONNXRUNTIME, qdq_unit_reason

MS = "com.microsoft"
# activation -> its float attributes. FusedGemm hands every "activation_<name>" attribute to the
# activation's kernel (contrib_ops/cpu/fused_gemm.cc), which requires each one to be present, so
# defaults are always written out. Clip, Gelu and Mish are refused at load ("unknown kernel type").
ACTIVATIONS = {"Relu": (), "Sigmoid": (), "Tanh": (), "Softplus": (), "Softsign": (), "LeakyRelu": ("alpha",),
               "Elu": ("alpha",), "ThresholdedRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"),
               "Selu": ("alpha", "gamma")}
GEMM_ATTRIBUTES = ("alpha", "beta", "transA", "transB")  # not Gemm-6's "broadcast": FusedGemm broadcasts C like Gemm-7+


@register
class FuseGemmActivation(PatternPass):
    """y = act(alpha * A' B' + beta * C)  =>  FusedGemm(A, B, C; activation, activation_alpha/beta/gamma)

        A ── Gemm(B, C?; alpha, beta, transA, transB) ── Relu | LeakyRelu | Sigmoid | Tanh | HardSigmoid
                                                          | Elu | Selu | Softplus | Softsign | ThresholdedRelu ── y
          =>  A ── com.microsoft::FusedGemm(B, C?) ── y

    Gemm's alpha, beta, transA and transB are kept. The activation's own attributes become
    activation_alpha / activation_beta / activation_gamma, written out even at their schema
    defaults (the kernel refuses a missing one). A float32 kernel only (float16 where the CPU ran the
    Gemm and activation in float32 too: targets.emit_reason), and only onnxruntime's CPU provider
    has one: the pass targets ort-cpu alone.
    """

    name = "fused-gemm"
    description = "Fuse Gemm + activation into com.microsoft FusedGemm (onnxruntime CPU)"
    label = "Gemm + activation -> FusedGemm"
    emits = (f"{MS}::FusedGemm",)
    pattern = Op(tuple(ACTIVATIONS), Op("Gemm", Var("a"), Var("b"), Var("c", optional=True), name="gemm"), name="act")

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        gemm = m.node("gemm")
        return g.dtype(gemm.outputs[0]) or g.dtype(m.tensor("a")), gemm

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        # onnxruntime makes QGemm of a QDQ Gemm (DequantizeLinear inputs) itself
        return qdq_unit_reason(m.node("gemm"), g, why=TO_ONNXRUNTIME)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        gemm, act = m.node("gemm"), m.node("act")
        attrs = {k: gemm.attrs[k] for k in GEMM_ATTRIBUTES if k in gemm.attrs}
        attrs["activation"] = act.op
        attrs.update({f"activation_{k}": schema_attribute(act, k, g.opset) for k in ACTIVATIONS[act.op]})
        inputs = [m.tensor("a"), m.tensor("b")] + ([m.tensor("c")] if m.tensor("c") is not None else [])
        fused = g.node("FusedGemm", inputs, attrs, name=f"{gemm.name}_fused", outputs=[act.outputs[0]], domain=MS)
        return Replacement(nodes=[fused])
