"""Normalization helpers: the ReduceMean forms, which trailing axes a norm normalizes, and
gamma/beta that broadcast over those axes only (layer-norm, rms-norm, simplified-layer-norm,
skip-layer-norm)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, TensorShape
from fuse_cli.match import Alt, Const, Op, Var, constant_value, producer_of, scalar_close
from fuse_cli.pipeline.base import Decline

HALF_TYPES = {t: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t))
              for t in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)}
def reduce_mean(of, name: str) -> Op:
    """ReduceMean with axes as an attribute (opset < 18) or as the second input (opset >= 18)."""
    return Op("ReduceMean", of, Var(f"{name}_axes", optional=True), name=name)


def half_source(x: gs.Tensor, cast_out: gs.Node, g: GraphEditor) -> gs.Tensor | None:
    """The float16/bfloat16 tensor `x` was Cast from, if `cast_out` casts back to that type."""
    cast_in, half = producer_of(x), HALF_TYPES.get(cast_out.attrs.get("to"))
    if half is None or cast_in is None or cast_in.op != "Cast" or g.dtype(cast_in.inputs[0]) != half:
        return None
    return cast_in.inputs[0]


def normalized_axis(shape: TensorShape | None, reductions: list[tuple[gs.Node, gs.Tensor | None]],
                    keepdims: int = 1) -> int | Decline:
    """The first normalized axis if every reduction (ReduceMean, ReduceSum: with `keepdims`)
    reduces the same trailing axes [axis, rank) of a tensor of `shape`, else why not."""
    if shape is None:
        return Decline(f"the rank of {reductions[0][0].name}'s input is unknown")
    rank, first = shape.rank, None
    for node, axes_tensor in reductions:
        if node.attrs.get("keepdims", 1) != keepdims:
            return Decline(f"{node.name} has keepdims={node.attrs.get('keepdims', 1)}")
        axes = node.attrs.get("axes") if axes_tensor is None else constant_value(axes_tensor)
        if axes_tensor is not None and axes is None:
            return Decline(f"{node.name}'s axes {axes_tensor.name!r} are computed at run time")
        axes = [int(a) for a in np.asarray(axes if axes is not None else [], dtype=np.int64).reshape(-1)]
        if not axes and node.attrs.get("noop_with_empty_axes", 0):
            return Decline(f"{node.name} reduces nothing (noop_with_empty_axes=1)")
        if any(not -rank <= a < rank for a in axes):
            return Decline(f"{node.name} reduces axes {axes}, out of range for rank {rank}")
        normalized = sorted({a % rank for a in axes}) or list(range(rank))
        if normalized != list(range(normalized[0], rank)):
            return Decline(f"{node.name} reduces axes {axes} of a rank-{rank} tensor, "
                           "not trailing axes ending at the last")
        if first is not None and normalized[0] != first:
            return Decline(f"{node.name} reduces from axis {normalized[0]}, the mean from axis {first}")
        first = normalized[0]
    return first


def read_only_by_constant_op(out: gs.Tensor, ops: tuple[str, ...], g: GraphEditor) -> bool:
    """True if `out` is no graph output and its only reader is one of `ops` with constant other inputs
    (a gamma or beta that a larger form of a normalization pattern would take in)."""
    if g.is_graph_output(out) or len(out.outputs) != 1 or out.outputs[0].op not in ops:
        return False
    return all(constant_value(t) is not None for t in out.outputs[0].inputs if t is not out)


def param_reason(g: GraphEditor, param: gs.Tensor | None, role: str, node: gs.Node | None,
                 shape: TensorShape, axis: int, dtype: np.dtype) -> Decline | None:
    """None if `param` (gamma or beta) broadcasts over the normalized axes [axis, rank) only."""
    if param is None:
        return None
    normalized = shape.dims[axis:]
    where = f"{node.name}'s {role} {param.name!r}"
    if any(not isinstance(d, int) for d in normalized):
        return Decline(f"the normalized dims {list(normalized)} are not all static")
    p = g.shape(param)
    if p is None or any(not isinstance(d, int) for d in p.dims):
        return Decline(f"{where} has an unknown shape")
    if g.dtype(param) != dtype:
        return Decline(f"{where} has dtype {g.dtype(param)}, the normalized value {dtype}")
    if p.rank > shape.rank:
        return Decline(f"{where} has rank {p.rank}, more than the input's {shape.rank}")
    for i, d in enumerate(p.dims):
        j = shape.rank - p.rank + i
        if d != 1 and (j < axis or d != normalized[j - axis]):
            kind = "a non-normalized axis" if j < axis else "normalized axis"
            return Decline(f"{where} of shape {list(p.dims)} broadcasts over {kind} {j} "
                           f"of the input {list(shape.dims)}")
    if constant_value(param) is None and tuple(p.dims) != tuple(normalized):
        return Decline(f"{where} is computed at run time with shape {list(p.dims)}, not exactly {list(normalized)}")
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



MEAN_SQUARED_INPUT = Alt(Op("Pow", Var("x"), Const(scalar_close(2.0)), name="square"),
              Op("Mul", Var("x"), Var("x"), name="square"))
RMS = Op("Sqrt", Op("Add", reduce_mean(MEAN_SQUARED_INPUT, "mean_square"), Var("eps", const=True), name="add_eps"),
         name="sqrt")
RMS_NORMALIZED = Alt(
    Op("Div", Var("x"), RMS, name="normalize"),
    Op("Mul", Var("x"), Alt(Op("Reciprocal", RMS, name="inverse"),
                            Op("Div", Const(scalar_close(1.0)), RMS, name="inverse")), name="normalize"),
)
