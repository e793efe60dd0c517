"""A bias Add and Gelu -> onnxruntime's BiasGelu."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Alt, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activation_pass import MS, ActivationPass, approximated


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    # Add(bias, x) is also tried as input=bias, bias=x: no candidate, and its near-miss ("x is
    # computed at run time") would hide the real one of the other ordering.
    return constant_value(m.tensor("input")) is None or constant_value(m.tensor("bias")) is not None


@register
class FuseBiasGelu(ActivationPass):
    """y = gelu(input + bias), bias a constant over the last axis  -> BiasGelu(input, bias)

        input ── Add(bias) ── Gelu ── y      =>   input ── BiasGelu(bias) ── y

    Gelu is onnxruntime's (contrib-gelu's output) or the standard one with approximate="none".
    Runs before matmul-add, which would otherwise take a rank-2 MatMul's Add into a Gemm.
    Declined where the model may run on the CPU provider (ort, ort-cpu): its kernel there is
    slower than the two nodes it replaces (targets.SLOWER).
    """

    name = "bias-gelu"
    description = "Fuse a bias Add and Gelu into onnxruntime's BiasGelu (declined where the CPU runs it: slower)"
    label = "Add (bias) + Gelu -> BiasGelu"
    fused_op = "BiasGelu"
    emits = ("com.microsoft::BiasGelu",)
    pattern = Alt(Op("Gelu", Op("Add", Var("input"), Var("bias", const=True), name="add"), name="gelu", domain=MS),
                  Op("Gelu", Op("Add", Var("input"), Var("bias", const=True), name="add"), name="gelu",
                     approximate=approximated("none")))

    requires = (Requirement(
        "Add(bias, x) is also tried as input=bias, bias=x: no candidate, and its near-miss ('x is computed at "
        "run time') would hide the real one of the other ordering.",
        _is_this_pattern),)

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node]:
        # the engine asks before check: on the CPU no other condition matters, and each ordering
        # of the Add's operands then gives the same reason
        return super().emitted_at(m, g)[0], m.node("gelu")
