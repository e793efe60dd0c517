"""A decomposed RMSNorm (T5, Llama) -> the standard RMSNormalization (opset 23)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, Var, constant_value, producer_of
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.toolkit.norms import (RMS_NORMALIZED, half_source, normalized_axis, param_reason, param_tensor,
                                    read_only_by_constant_op)
from fuse_cli.toolkit.shapes import rank_reason
from fuse_cli.pipeline.registry import register


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Without gamma, silent where a constant Mul reads the result: the gamma form reports there.
    Without gamma nor the Cast back, silent where the only reader casts the result back to the
    float16 x came from: the stash_type form, rooted there, fuses it or says why (a gamma applied
    in float32 before that Cast, Gemma's, is no stash_type form: its float32 part fuses). Silent
    where x is x - mean(x): that is a LayerNorm (layer-norm's pattern), not an RMSNorm."""
    out = m.root.outputs[0]
    if not ("scale" in m.nodes or not read_only_by_constant_op(out, ("Mul",), g)):
        return False
    reader = out.outputs[0] if len(out.outputs) == 1 and not g.is_graph_output(out) else None
    if (not {"cast_out", "scale"} & set(m.nodes) and reader is not None and reader.op == "Cast"
            and half_source(m.tensor("x"), reader, g) is not None):
        return False
    centered = producer_of(m.tensor("x"))
    return not (centered is not None and centered.op == "Sub"
                and _is_mean_of(centered.inputs[1], centered.inputs[0]))


@register
class FuseRMSNormalization(PatternPass):
    """y = x / sqrt(mean(x^2) + eps) * gamma   over trailing axes [axis, rank)

        x ─┬──────────────────────────────────────────── Div ── Mul(gamma) ── y
           └─ Pow(2) ── ReduceMean ── Add(eps) ── Sqrt ──┘
          =>  x ── RMSNormalization(gamma, axis, epsilon) ── y

    Also Mul(x, x) for Pow, Mul(x, Reciprocal(rms)) or Mul(x, Div(1, rms)) (torch's rsqrt) for Div,
    operands in either order, and without Mul(gamma) (elementwise_affine=False: gamma = ones).
    Exact under the same conditions as layer-norm: one ReduceMean (keepdims=1) over trailing axes,
    eps a constant scalar, gamma broadcasting over those axes only. torch's float16 form

        x16 ── Cast(float) ── (the above, float32) ── Cast(float16) ── Mul(gamma16) ── y16

    is RMSNormalization's own definition with stash_type=1 (compute in float32, cast the
    normalized value back, then scale), so it fuses on x16 directly: one node where the float32
    interior alone left four (Cast, RMSNormalization, Cast, Mul), and the one node a norm between
    a head split and its Transpose must be for standard-rotary-before-head-split (Qwen3's q/k norms).
    """

    name = "rms-norm"
    description = "Fuse a decomposed RMSNorm (Pow/ReduceMean/Sqrt/Div/Mul) into RMSNormalization"
    label = "decomposed RMSNorm -> RMSNormalization"
    min_opset = 23
    pattern = Alt(Op("Mul", Op("Cast", RMS_NORMALIZED, name="cast_out"), Var("gamma"), name="scale"),
                  Op("Mul", RMS_NORMALIZED, Var("gamma"), name="scale"),
                  Op("Cast", RMS_NORMALIZED, name="cast_out"),
                  RMS_NORMALIZED)  # largest first

    requires = (Requirement(
        "Without gamma, silent where a constant Mul reads the result: the gamma form reports there. Without "
        "gamma nor the Cast back, silent where the only reader casts the result back to the float16 x came "
        "from: the stash_type form reports there. Silent where x is x - mean(x): that is a LayerNorm "
        "(layer-norm's pattern), not an RMSNorm.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x = m.tensor("x")
        if g.dtype(x) != np.float32:
            return Decline(f"{m.node('normalize').name} computes in {g.dtype(x)}; "
                           "RMSNormalization would compute in float32")
        if "cast_out" in m.nodes and half_source(x, m.node("cast_out"), g) is None:
            return Decline(f"{m.node('cast_out').name} casts the normalized value to another type, but {x.name!r} "
                           "is not a Cast from that type: RMSNormalization's stash_type form needs the round trip")
        shape = g.shape(x)
        axis = normalized_axis(shape, [(m.node("mean_square"), m.tensor("mean_square_axes"))])
        if isinstance(axis, Decline):
            return axis
        eps = constant_value(m.tensor("eps"))
        if eps.size != 1:
            return Decline(f"{m.node('add_eps').name} adds eps of shape {list(eps.shape)}, not a scalar")
        return (param_reason(g, m.tensor("gamma"), "gamma", m.nodes.get("scale"), shape, axis,
                             g.dtype(_input(m, g)))
                or rank_reason(m, g))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x = _input(m, g)
        shape = g.shape(x)
        axis = normalized_axis(shape, [(m.node("mean_square"), m.tensor("mean_square_axes"))])
        gamma = param_tensor(g, m.tensor("gamma"), "gamma", shape, axis, g.dtype(x))
        attrs = {"axis": axis - shape.rank, "epsilon": float(constant_value(m.tensor("eps")).reshape(-1)[0])}
        if "cast_out" in m.nodes:
            attrs["stash_type"] = 1  # the default, written: the float32 interior is the point
        node = g.node("RMSNormalization", [x, gamma], attrs, name=f"{m.node('mean_square').name}_rmsnorm",
                      outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


def _input(m: Match, g: GraphEditor) -> gs.Tensor:
    """What RMSNormalization reads: x, or the float16/bfloat16 tensor x was Cast from."""
    return half_source(m.tensor("x"), m.node("cast_out"), g) if "cast_out" in m.nodes else m.tensor("x")


def _is_mean_of(mean: gs.Tensor, x: gs.Tensor) -> bool:
    node = producer_of(mean)
    return node is not None and node.op == "ReduceMean" and node.inputs[0] is x
