"""A LayerNorm written with moments (as jax2tf and tf2onnx write Flax's) -> LayerNormalization."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value, scalar_close
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.norms import normalized_axis, param_reason, param_tensor
from fuse_cli.toolkit.shapes import rank_reason


def _mean(of, name: str) -> Op:
    """ReduceSum(of, axes, keepdims=0) * (1/N): the mean, its reduced axes dropped."""
    return Op("Mul", Op("ReduceSum", of, Var(f"{name}_axes", optional=True), name=name),
              Var(f"{name}_scale", const=True), name=f"{name}_scaled")


def _broadcast(of, name: str) -> Op:
    """Expand(Reshape(of, shape), shape): the reduced axes put back as 1, for the Sub and Add after."""
    return Op("Expand", Op("Reshape", of, Var(f"{name}_shape")), Var(f"{name}_expand_shape"), name=name)


MEAN = _mean(Var("x"), "mean")
VARIANCE = Op("Max", Const(scalar_close(0.0)),
              Op("Sub", _mean(Op("Mul", Var("x"), Var("x"), name="square"), "mean_square"),
                 Op("Mul", Var("mean_scaled"), Var("mean_scaled"), name="mean_squared")), name="clamp")
INVERSE_STD = Op("Reciprocal", Op("Sqrt", Op("Add", _broadcast(VARIANCE, "variance_back"), Var("eps", const=True),
                                             name="add_eps")), name="inverse")
CENTERED = Op("Sub", Var("x"), _broadcast(MEAN, "mean_back"), name="centered")
NORMALIZED = Alt(Op("Mul", CENTERED, Op("Mul", INVERSE_STD, Var("gamma"), name="scale"), name="normalize"),
                 Op("Mul", CENTERED, INVERSE_STD, name="normalize"))


@register
class FuseMomentsLayerNormalization(PatternPass):
    """y = (x - E[x]) * gamma / sqrt(max(E[x^2] - E[x]^2, 0) + eps) + beta   over trailing axes

        x ─┬─ ReduceSum ── Mul(1/N) = m ─────── Reshape/Expand ─┐
           ├────────────────────────────────────────────────── Sub ─┐
           └─ Mul(x) ── ReduceSum ── Mul(1/N) ─┐                    │
                              m ── Mul(m) ──── Sub ── Max(0) ── Reshape/Expand ── Add(eps) ── Sqrt
                                   ── Reciprocal ── Mul(gamma) ── Mul ── Add(beta) ── y
          =>  x ── LayerNormalization(gamma, beta, axis, epsilon) ── y

    Flax's LayerNorm through jax2tf and tf2onnx: the means as ReduceSum(keepdims=0) times 1/N, the
    variance as E[x^2] - E[x]^2 clamped at 0, both put back over the reduced axes by Reshape and
    Expand to a shape computed at run time, rsqrt as Sqrt + Reciprocal, gamma on the inverse.
    The same function as LayerNormalization's (x - mean)^2 form, which computes the variance the
    exact way (no cancellation when the mean is large against the spread): fused, the result is
    at least as accurate. Exact when both sums reduce the same trailing axes [axis, rank), 1/N is
    the count of those elements, the broadcasts give x's shape with those axes at 1 (proved from
    the shapes, since their target is computed at run time), eps is a constant scalar, and
    gamma/beta broadcast over the normalized axes only. Without gamma or beta (use_scale,
    use_bias off) it fuses too.
    """

    name = "moments-layer-norm"
    description = "Fuse a LayerNorm written with moments (E[x^2] - E[x]^2; jax2tf) into LayerNormalization"
    label = "moments LayerNorm -> LayerNormalization"
    min_opset = 17
    runtime_min_opset = 1  # as layer-norm: onnxruntime registers LayerNormalization below opset 17
    pattern = Alt(Op("Add", NORMALIZED, Var("beta"), name="shift"), NORMALIZED)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        shape, dtype = g.shape(m.tensor("x")), g.dtype(m.tensor("x"))
        if dtype != np.float32:
            return Decline(f"{m.node('centered').name} computes in {dtype}; only float32 math is matched")
        axis = _axis(m, g)
        if isinstance(axis, Decline):
            return axis
        count = int(np.prod(shape.dims[axis:]))
        for name in ("mean_scaled", "mean_square_scaled"):
            scale = constant_value(m.tensor(name.replace("_scaled", "_scale")))
            if scale.size != 1 or not np.isclose(float(scale.reshape(-1)[0]), 1.0 / count, rtol=1e-6):
                return Decline(f"{m.node(name).name} scales the sum by {scale.reshape(-1)[:1].tolist()}, "
                               f"not 1/{count}: not the mean over the normalized axes")
        kept = tuple(shape.dims[:axis]) + (1,) * (shape.rank - axis)
        for name in ("mean_back", "variance_back"):
            back = g.shape(m.node(name).outputs[0])
            if back is None or tuple(back.dims) != kept or None in kept:
                return Decline(f"{m.node(name).name} gives {back and list(back.dims)}, not {list(kept)}: the "
                               f"reduced axes are not provably put back where they were")
        if constant_value(m.tensor("eps")).size != 1:
            eps_shape = list(constant_value(m.tensor("eps")).shape)
            return Decline(f"{m.node('add_eps').name} adds eps of shape {eps_shape}, not a scalar")
        return (param_reason(g, m.tensor("gamma"), "gamma", m.nodes.get("scale"), shape, axis, dtype)
                or param_reason(g, m.tensor("beta"), "beta", m.nodes.get("shift"), shape, axis, dtype)
                or rank_reason(m, g))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x = m.tensor("x")
        shape, axis = g.shape(x), _axis(m, g)
        attrs = {"axis": axis - shape.rank, "epsilon": float(constant_value(m.tensor("eps")).reshape(-1)[0])}
        inputs = [x, param_tensor(g, m.tensor("gamma"), "gamma", shape, axis, np.dtype(np.float32))]
        if m.tensor("beta") is not None:
            inputs.append(param_tensor(g, m.tensor("beta"), "beta", shape, axis, np.dtype(np.float32)))
        node = g.node("LayerNormalization", inputs, attrs, name=f"{m.node('mean').name}_layernorm",
                      outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


def _axis(m: Match, g: GraphEditor) -> int | Decline:
    """The first normalized axis: both sums reduce the same trailing axes, their axes dropped."""
    return normalized_axis(g.shape(m.tensor("x")), [(m.node(name), m.tensor(f"{name}_axes"))
                                                   for name in ("mean", "mean_square")], keepdims=0)
