"""RMSNorm (decomposed, or the standard RMSNormalization) -> onnxruntime's SimplifiedLayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Match, Op, Var, constant_value, producer_of
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.toolkit.norms import (RMS_NORMALIZED, half_source, normalized_axis, param_reason, param_tensor,
                                    read_only_by_constant_op)
from fuse_cli.pipeline.registry import register


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Without gamma, silent where a constant Mul reads the result: the gamma form reports there."""
    return bool({"scale", "rmsnorm"} & set(m.nodes)) or not read_only_by_constant_op(m.root.outputs[0], ("Mul",), g)


@register
class FuseSimplifiedLayerNormalization(PatternPass):
    """y = x / sqrt(mean(x^2) + eps) * gamma   over trailing axes [axis, rank)

        x ─┬──────────────────────────────────────────── Div ── Mul(gamma) ── y
           └─ Pow(2) ── ReduceMean ── Add(eps) ── Sqrt ──┘
          =>  x ── SimplifiedLayerNormalization(gamma, axis, epsilon) ── y

    The decomposed forms are rms-norm's (Mul(x, x) for Pow; Mul(x, Reciprocal(rms)) or
    Mul(x, Div(1, rms)) for Div; operands in either order; without Mul(gamma), where gamma is all
    ones and eliminate-noop-arith removed it or the model has no affine scale: gamma = ones), and
    a standard RMSNormalization (what rms-norm writes at opset >= 23) is taken as it is; torch's
    float16 form (x16 ── Cast(float) ── ... ── Cast(float16) ── Mul(gamma16)) fuses on x16 with
    stash_type=1, the kernel's own float32 computation. Exact under
    rms-norm's conditions:
    one ReduceMean (keepdims=1) over trailing axes, eps a constant scalar, gamma broadcasting over
    those axes only (it is given to onnxruntime with exactly the normalized shape).
    onnxruntime registers SimplifiedLayerNormalization in the default domain although it is not
    an ONNX operator: onnx.checker rejects the result, onnxruntime runs it at any opset.
    """

    name = "simplified-layer-norm"
    description = "Fuse RMSNorm into onnxruntime's SimplifiedLayerNormalization"
    label = "RMSNorm -> SimplifiedLayerNormalization"
    emits = ("SimplifiedLayerNormalization",)
    # largest first; torch's float16 RMSNorm computes in float32 between Casts (x.to(float32) ...
    # .to(input_dtype)) and scales after: SimplifiedLayerNormalization's own stash_type=1
    pattern = Alt(Op("Mul", Op("Cast", RMS_NORMALIZED, name="cast_out"), Var("gamma"), name="scale"),
                  Op("Mul", RMS_NORMALIZED, Var("gamma"), name="scale"),
                  Op("RMSNormalization", Var("x"), Var("gamma"), name="rmsnorm"),
                  Op("Cast", RMS_NORMALIZED, name="cast_out"),
                  RMS_NORMALIZED)

    requires = (Requirement(
        "Without gamma, silent where a constant Mul reads the result: the gamma form reports there.",
        _is_this_pattern),)

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("x")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x = m.tensor("x")
        norm = m.node("rmsnorm") if "rmsnorm" in m.nodes else m.node("normalize")
        dtype = g.dtype(x)
        if dtype is None or ("rmsnorm" not in m.nodes and dtype != np.float32):
            return Decline(f"{norm.name} computes in {dtype}; only float32 RMSNorm is matched")
        if "cast_out" in m.nodes and half_source(x, m.node("cast_out"), g) is None:
            return Decline(f"{m.node('cast_out').name} casts the normalized value to another type, but {x.name!r} "
                           "is not a Cast from that type: the stash_type form needs the round trip")
        if "rmsnorm" not in m.nodes and _is_centered(x):
            return Decline(f"{m.node('square').name} squares x - mean(x): a LayerNorm (see layer-norm)")
        shape = g.shape(x)
        axis = rms_axis(m, g)
        if isinstance(axis, Decline):
            return axis
        if "rmsnorm" not in m.nodes and constant_value(m.tensor("eps")).size != 1:
            return Decline(f"{m.node('add_eps').name} adds an eps that is not a scalar")
        owner = m.nodes.get("rmsnorm") or m.nodes.get("scale")
        return param_reason(g, m.tensor("gamma"), "gamma", owner, shape, axis, g.dtype(_input(m, g)))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x = _input(m, g)
        shape, axis = g.shape(x), rms_axis(m, g)
        gamma = param_tensor(g, m.tensor("gamma"), "gamma", shape, axis, g.dtype(x))
        if "rmsnorm" in m.nodes:
            source = m.node("rmsnorm")
            epsilon, stash_type = float(source.attrs.get("epsilon", 1e-5)), int(source.attrs.get("stash_type", 1))
        else:
            source = m.node("mean_square")
            epsilon, stash_type = float(constant_value(m.tensor("eps")).reshape(-1)[0]), 1
        node = g.node("SimplifiedLayerNormalization", [x, gamma],
                      {"axis": axis - shape.rank, "epsilon": epsilon, "stash_type": stash_type},
                      name=f"{source.name}_simplified", outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


def _input(m: Match, g: GraphEditor) -> gs.Tensor:
    """What SimplifiedLayerNormalization reads: x, or the float16/bfloat16 tensor x was Cast from."""
    return half_source(m.tensor("x"), m.node("cast_out"), g) if "cast_out" in m.nodes else m.tensor("x")


def rms_axis(m: Match, g: GraphEditor) -> int | Decline:
    """The first normalized axis (non-negative), or why it is not known."""
    shape = g.shape(m.tensor("x"))
    if "rmsnorm" not in m.nodes:
        return normalized_axis(shape, [(m.node("mean_square"), m.tensor("mean_square_axes"))])
    node = m.node("rmsnorm")
    if shape is None:
        return Decline(f"the rank of {node.name}'s input is unknown")
    if len([t for t in node.outputs if t.name]) > 1:
        return Decline(f"{node.name} has more than one output")
    axis = int(node.attrs.get("axis", -1))
    if not -shape.rank <= axis < shape.rank:
        return Decline(f"{node.name}'s axis {axis} is out of range")
    return axis % shape.rank


def _is_centered(x: gs.Tensor) -> bool:
    """x = Sub(t, ReduceMean(t)): the squares are a variance, so this is a LayerNorm's tail."""
    sub = producer_of(x)
    if sub is None or sub.op != "Sub":
        return False
    mean = producer_of(sub.inputs[1])
    return mean is not None and mean.op == "ReduceMean" and mean.inputs[0] is sub.inputs[0]
