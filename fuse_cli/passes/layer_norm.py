"""A decomposed LayerNorm (as torch.onnx.export writes it below opset 17) -> LayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, TensorShape
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value, producer_of, scalar_close
from fuse_cli.passes.base import PatternPass
from fuse_cli.passes.registry import register

HALF_TYPES = {t: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t))
              for t in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)}


def reduce_mean(of, name: str) -> Op:
    """ReduceMean with axes as an attribute (opset < 18) or as the second input (opset >= 18)."""
    return Op("ReduceMean", of, Var(f"{name}_axes", optional=True), name=name)


# Named, the Sub also names its output: the squares below must square that very tensor.
CENTERED = Op("Sub", Var("x"), reduce_mean(Var("x"), "mean"), name="centered")
SQUARED = Alt(Op("Pow", Var("centered"), Const(scalar_close(2.0)), name="square"),
              Op("Mul", Var("centered"), Var("centered"), name="square"))
STD = Op("Sqrt", Op("Add", reduce_mean(SQUARED, "variance"), Var("eps", const=True), name="add_eps"), name="sqrt")
NORMALIZED = Alt(Op("Div", CENTERED, STD, name="normalize"),
                 Op("Mul", CENTERED, Op("Reciprocal", STD, name="reciprocal"), name="normalize"))
CORE = Alt(NORMALIZED, Op("Cast", NORMALIZED, name="cast_out"))
SCALED = Op("Mul", CORE, Var("gamma"), name="scale")


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
    LayerNormalization's own definition with stash_type=1, so it fuses on x16 directly.
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

    def matches(self, m: Match, g: GraphEditor) -> bool:
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

    def check(self, m: Match, g: GraphEditor) -> str | None:
        x, dtype = input_of(m, g)
        if isinstance(dtype, str):
            return dtype
        shape = g.shape(x)
        axis = normalized_axis(shape, [(m.node("mean"), m.tensor("mean_axes")),
                                       (m.node("variance"), m.tensor("variance_axes"))])
        if isinstance(axis, str):
            return axis
        eps = constant_value(m.tensor("eps"))
        if eps.size != 1:
            return f"{m.node('add_eps').name} adds eps of shape {list(eps.shape)}, not a scalar"
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
        node = gs.Node(op="LayerNormalization", name=g.unique_name(f"{m.node('mean').name}_layernorm"),
                       attrs=attrs, inputs=inputs, outputs=[m.root.outputs[0]])
        return Replacement(nodes=[node])


def input_of(m: Match, g: GraphEditor) -> tuple[gs.Tensor, np.dtype | str]:
    """The tensor LayerNormalization reads and the dtype of gamma/beta, or why the dtypes do not fit:
    float32 math, or float32 math between Cast(float) of a float16/bfloat16 x and Cast back."""
    x = m.tensor("x")
    if g.dtype(x) != np.float32:
        return x, (f"{m.node('centered').name} computes in {g.dtype(x)}; only float32 math "
                   "(or float16 Cast to float32 and back) fuses exactly")
    if "cast_out" not in m.nodes:
        return x, np.dtype(np.float32)
    cast_out = m.node("cast_out")
    x_half = half_source(x, cast_out, g)
    if x_half is None:
        return x, (f"{cast_out.name} casts the normalized value to another type, but {x.name!r} is not a Cast "
                   "from that type: LayerNormalization's stash_type form needs the round trip")
    return x_half, g.dtype(x_half)


def half_source(x: gs.Tensor, cast_out: gs.Node, g: GraphEditor) -> gs.Tensor | None:
    """The float16/bfloat16 tensor `x` was Cast from, if `cast_out` casts back to that type."""
    cast_in, half = producer_of(x), HALF_TYPES.get(cast_out.attrs.get("to"))
    if half is None or cast_in is None or cast_in.op != "Cast" or g.dtype(cast_in.inputs[0]) != half:
        return None
    return cast_in.inputs[0]


def normalized_axis(shape: TensorShape | None, reductions: list[tuple[gs.Node, gs.Tensor | None]]) -> int | str:
    """The first normalized axis if every ReduceMean (keepdims=1) reduces the same trailing axes
    [axis, rank) of a tensor of `shape`, else why not."""
    if shape is None:
        return f"the rank of {reductions[0][0].name}'s input is unknown"
    rank, first = shape.rank, None
    for node, axes_tensor in reductions:
        if node.attrs.get("keepdims", 1) != 1:
            return f"{node.name} has keepdims=0"
        axes = node.attrs.get("axes") if axes_tensor is None else constant_value(axes_tensor)
        if axes_tensor is not None and axes is None:
            return f"{node.name}'s axes {axes_tensor.name!r} are computed at run time"
        axes = [int(a) for a in np.asarray(axes if axes is not None else [], dtype=np.int64).reshape(-1)]
        if not axes and node.attrs.get("noop_with_empty_axes", 0):
            return f"{node.name} reduces nothing (noop_with_empty_axes=1)"
        if any(not -rank <= a < rank for a in axes):
            return f"{node.name} reduces axes {axes}, out of range for rank {rank}"
        normalized = sorted({a % rank for a in axes}) or list(range(rank))
        if normalized != list(range(normalized[0], rank)):
            return f"{node.name} reduces axes {axes} of a rank-{rank} tensor, not trailing axes ending at the last"
        if first is not None and normalized[0] != first:
            return f"{node.name} reduces from axis {normalized[0]}, the mean from axis {first}"
        first = normalized[0]
    return first


def read_only_by_constant_op(out: gs.Tensor, ops: tuple[str, ...], g: GraphEditor) -> bool:
    """True if `out` is no graph output and its only reader is one of `ops` with constant other inputs
    (a gamma or beta that a larger form of a normalization pattern would take in)."""
    if g.is_graph_output(out) or len(out.outputs) != 1 or out.outputs[0].op not in ops:
        return False
    return all(constant_value(t) is not None for t in out.outputs[0].inputs if t is not out)


def rank_reason(m: Match, g: GraphEditor) -> str | None:
    """None unless a constant in the match has more dims than x: it broadcasts the result to a
    higher rank than the fused operator, whose output has x's shape, would give."""
    x = m.tensor("x")
    shape = g.shape(x)
    for node in m.covered:
        for t in node.inputs:
            value = constant_value(t)
            if value is not None and value.ndim > (shape.rank if shape is not None else 1):
                return (f"{node.name}'s constant {t.name!r} of shape {list(value.shape)} broadcasts "
                        f"{x.name!r} (rank {shape.rank if shape is not None else 'unknown'}) to rank {value.ndim}")
    return None


def param_reason(g: GraphEditor, param: gs.Tensor | None, role: str, node: gs.Node | None,
                 shape: TensorShape, axis: int, dtype: np.dtype) -> str | None:
    """None if `param` (gamma or beta) broadcasts over the normalized axes [axis, rank) only."""
    if param is None:
        return None
    normalized = shape.dims[axis:]
    where = f"{node.name}'s {role} {param.name!r}"
    if any(not isinstance(d, int) for d in normalized):
        return f"the normalized dims {list(normalized)} are not all static"
    p = g.shape(param)
    if p is None or any(not isinstance(d, int) for d in p.dims):
        return f"{where} has an unknown shape"
    if g.dtype(param) != dtype:
        return f"{where} has dtype {g.dtype(param)}, the normalized value {dtype}"
    if p.rank > shape.rank:
        return f"{where} has rank {p.rank}, more than the input's {shape.rank}"
    for i, d in enumerate(p.dims):
        j = shape.rank - p.rank + i
        if d != 1 and (j < axis or d != normalized[j - axis]):
            kind = "a non-normalized axis" if j < axis else "normalized axis"
            return f"{where} of shape {list(p.dims)} broadcasts over {kind} {j} of the input {list(shape.dims)}"
    if constant_value(param) is None and tuple(p.dims) != tuple(normalized):
        return f"{where} is computed at run time with shape {list(p.dims)}, not exactly {list(normalized)}"
    return None


def param_tensor(g: GraphEditor, param: gs.Tensor | None, role: str, shape: TensorShape, axis: int,
                 dtype: np.dtype) -> gs.Tensor:
    """`param` with exactly the normalized shape (a new constant when it must be broadcast);
    when absent, ones (a missing scale multiplies by one)."""
    normalized = tuple(shape.dims[axis:])
    if param is None:
        return g.constant(role, np.ones(normalized, dtype=dtype))
    if tuple(g.shape(param).dims) == normalized:
        return param
    value = constant_value(param)
    value = value.reshape(value.shape[max(0, value.ndim - len(normalized)):])
    return g.constant(f"{param.name}_normalized_shape", np.broadcast_to(value, normalized).astype(dtype))
