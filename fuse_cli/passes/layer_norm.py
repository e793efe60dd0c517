"""A decomposed LayerNorm (as torch.onnx.export writes it below opset 17) -> LayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value, scalar_close
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.norms import (HALF_TYPES, half_source, normalized_axis, param_reason, param_tensor,
                                    read_only_by_constant_op, reduce_mean)
from fuse_cli.toolkit.shapes import rank_reason

WIDE_TYPES = {onnx.TensorProto.FLOAT: np.dtype(np.float32), onnx.TensorProto.DOUBLE: np.dtype(np.float64)}


# Named, the Sub also names its output: the squares below must square that very tensor.
CENTERED = Op("Sub", Var("x"), reduce_mean(Var("x"), "mean"), name="centered")
SQUARED = Alt(Op("Pow", Var("centered"), Const(scalar_close(2.0)), name="square"),
              Op("Mul", Var("centered"), Var("centered"), name="square"))
STD = Op("Sqrt", Op("Add", reduce_mean(SQUARED, "variance"), Var("eps", const=True), name="add_eps"), name="sqrt")
NORMALIZED = Alt(Op("Div", CENTERED, STD, name="normalize"),
                 Op("Mul", CENTERED, Op("Reciprocal", STD, name="reciprocal"), name="normalize"))


def _normalized_wide():
    """torch's float16 export below opset 17: the mean and x - mean in float16, the rest in a
    wider float (x - mean Cast to float64), Cast back to float16."""
    wide = Op("Cast", CENTERED, name="widen")
    squared = Alt(Op("Pow", Var("widen"), Const(scalar_close(2.0)), name="square"),
                  Op("Mul", Var("widen"), Var("widen"), name="square"))
    std = Op("Sqrt", Op("Add", reduce_mean(squared, "variance"), Var("eps", const=True), name="add_eps"), name="sqrt")
    return Alt(Op("Div", wide, std, name="normalize"),
               Op("Mul", wide, Op("Reciprocal", std, name="reciprocal"), name="normalize"))


CORE = Alt(NORMALIZED, Op("Cast", NORMALIZED, name="cast_out"), Op("Cast", _normalized_wide(), name="cast_out"))
SCALED = Op("Mul", CORE, Var("gamma"), name="scale")


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """A smaller form whose only reader is what a larger form adds (the Cast back to half, a
    constant Mul or Add) is silent: the larger form, rooted there, fuses it or says why not, once."""
    if "shift" in m.nodes:
        return True
    out = m.root.outputs[0]
    if "scale" in m.nodes:
        return not read_only_by_constant_op(out, ("Add",), g)
    reader = out.outputs[0] if len(out.outputs) == 1 and not g.is_graph_output(out) else None
    if "cast_out" not in m.nodes and reader is not None and reader.op == "Cast":
        return half_source(m.tensor("x"), reader, g) is None
    return not read_only_by_constant_op(out, ("Mul", "Add"), g)


@register
class FuseLayerNormalization(PatternPass):
    """y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta  over trailing axes

        x ─┬─ ReduceMean ─┐
           └──────────── Sub = d ─┬──────────────────────────────────── Div ── Mul(gamma) ── Add(beta)
                                  └─ Pow(2) ── ReduceMean ── Add(eps) ── Sqrt ─┘
          =>  x ── LayerNormalization(gamma, beta, axis, epsilon) ── y

    Also Mul(d, d) for Pow, Mul(d, Reciprocal(std)) for Div, Mul/Add operands in either order;
    without Add(beta) (torch's bias=False: no B input), without Mul(gamma) (gamma = ones), or
    without both (elementwise_affine=False). Exact when both ReduceMeans (keepdims=1) reduce the
    same trailing axes [axis, rank), eps is a constant scalar, and gamma/beta broadcast over those
    axes only. The fp16 export (x16 ── Cast(float) ── ...Div ── Cast(float16) ── Mul ── Add) is
    LayerNormalization's own definition with stash_type=1, so it fuses on x16 directly; so does
    torch's other fp16 form (mean and x - mean in float16, Cast(float64) of x - mean for the
    variance and the division, Cast back), whose float32 stash is within float16's rounding of it.
    """

    name = "layer-norm"
    description = "Fuse a decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div) into LayerNormalization"
    label = "decomposed LayerNorm -> LayerNormalization"
    min_opset = 17
    # onnxruntime registers LayerNormalization in the default domain for opsets 1-16 as well (CPU
    # and CUDA kernels), so its targets fuse opset-14 exports without converting them.
    runtime_min_opset = 1
    # Largest first: the sweep visits Add(beta) before the Mul(gamma) and Div inside it.
    pattern = Alt(Op("Add", Alt(SCALED, CORE), Var("beta"), name="shift"), SCALED, CORE)

    requires = (Requirement(
        "A smaller form whose only reader is what a larger form adds (the Cast back to half, a constant Mul "
        "or Add) is silent: the larger form, rooted there, fuses it or says why not, once.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        x, dtype = input_of(m, g)
        if isinstance(dtype, Decline):
            return dtype
        shape = g.shape(x)
        axis = normalized_axis(shape, [(m.node("mean"), m.tensor("mean_axes")),
                                       (m.node("variance"), m.tensor("variance_axes"))])
        if isinstance(axis, Decline):
            return axis
        eps = constant_value(m.tensor("eps"))
        if eps.size != 1:
            return Decline(f"{m.node('add_eps').name} adds eps of shape {list(eps.shape)}, not a scalar")
        return (param_reason(g, m.tensor("gamma"), "gamma", m.nodes.get("scale"), shape, axis, dtype)
                or param_reason(g, m.tensor("beta"), "beta", m.nodes.get("shift"), shape, axis, dtype)
                or rank_reason(m, g))

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        x, dtype = input_of(m, g)
        shape = g.shape(x)
        axis = normalized_axis(shape, [(m.node("mean"), m.tensor("mean_axes"))])
        attrs = {"axis": axis - shape.rank, "epsilon": float(constant_value(m.tensor("eps")).reshape(-1)[0])}
        if "cast_out" in m.nodes:
            attrs["stash_type"] = 1
        inputs = [x, param_tensor(g, m.tensor("gamma"), "gamma", shape, axis, dtype)]
        if m.tensor("beta") is not None:
            inputs.append(param_tensor(g, m.tensor("beta"), "beta", shape, axis, dtype))
        node = g.node("LayerNormalization", inputs, attrs, name=f"{m.node('mean').name}_layernorm",
                      outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


def input_of(m: Match, g: GraphEditor) -> tuple[gs.Tensor, np.dtype | Decline]:
    """The tensor LayerNormalization reads and the dtype of gamma/beta, or why the dtypes do not fit:
    float32 math, or float32 math between Cast(float) of a float16/bfloat16 x and Cast back."""
    x = m.tensor("x")
    if "widen" in m.nodes:
        return _widened_input(m, g)
    if g.dtype(x) != np.float32:
        return x, (Decline(f"{m.node('centered').name} computes in {g.dtype(x)}; only float32 math "
                   "(or float16 Cast to float32 and back) fuses exactly"))
    if "cast_out" not in m.nodes:
        return x, np.dtype(np.float32)
    cast_out = m.node("cast_out")
    x_half = half_source(x, cast_out, g)
    if x_half is None:
        return x, (Decline(f"{cast_out.name} casts the normalized value to another type, but {x.name!r} is not a Cast "
                   "from that type: LayerNormalization's stash_type form needs the round trip"))
    return x_half, g.dtype(x_half)




def _widened_input(m: Match, g: GraphEditor) -> tuple[gs.Tensor, np.dtype | Decline]:
    """x itself (float16/bfloat16), where x - mean is Cast to a wider float and the result back to x's type."""
    x, widen, cast_out = m.tensor("x"), m.node("widen"), m.node("cast_out")
    half, wide = HALF_TYPES.get(cast_out.attrs.get("to")), WIDE_TYPES.get(widen.attrs.get("to"))
    if half is None or g.dtype(x) != half:
        return x, Decline(f"{cast_out.name} casts the normalized value to {cast_out.attrs.get('to')}, not to the "
                          f"float16/bfloat16 type of {x.name!r} ({g.dtype(x)})")
    if wide is None:
        return x, Decline(f"{widen.name} casts {m.tensor('centered').name!r} to {widen.attrs.get('to')}, "
                          "not to a wider float")
    return x, half
