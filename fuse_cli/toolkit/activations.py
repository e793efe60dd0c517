"""Activation helpers: the GELU gates as patterns, the 1-D bias onnxruntime's fused kernels take,
and an activation's attribute defaults from its schema."""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import defs, helper

from fuse_cli.graph.edit import GraphEditor, TensorShape
from fuse_cli.match import Alt, Const, Op, Var, constant_value, scalar_close
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.shapes import dims_list

X = Var("x")
HALF = Const(scalar_close(0.5))
ONE = Const(scalar_close(1.0))
ERF_GATE = Op("Add", Op("Erf", Alt(Op("Div", X, Const(scalar_close(math.sqrt(2.0)))),
                                   Op("Mul", X, Const(scalar_close(1.0 / math.sqrt(2.0))))), name="erf"), ONE)
CUBE = Alt(Op("Pow", X, Const(scalar_close(3.0))), Op("Mul", X, Op("Mul", X, X)))
CUBIC_TERM = Const(scalar_close(0.044715))
# 0.044715 * x^3, or x * (x * (0.044715 * x)) as jax2tf writes it
SCALED_CUBE = Alt(Op("Mul", CUBIC_TERM, CUBE), Op("Mul", X, Op("Mul", X, Op("Mul", CUBIC_TERM, X))))
TANH_GATE = Op("Add", Op("Tanh", Op("Mul", Const(scalar_close(math.sqrt(2.0 / math.pi))),
                                    Op("Add", X, SCALED_CUBE)), name="tanh"), ONE)


def decomposed_gelu(gate, x=X) -> Alt:
    """gelu's forms: (x * gate) * 0.5, (0.5 * x) * gate or x * (0.5 * gate), operands in either order."""
    return Alt(Op("Mul", Op("Mul", x, gate, name="inner"), HALF, name="outer"),
               Op("Mul", Op("Mul", x, HALF, name="inner"), gate, name="outer"),
               Op("Mul", x, Op("Mul", HALF, gate, name="inner"), name="outer"))


def bias_reason(g: GraphEditor, bias: gs.Tensor | None, add: gs.Node | None, shape: TensorShape,
                dtype: np.dtype) -> Decline | None:
    """None if `bias` (added to a tensor of `shape` and `dtype`) is a constant over the last axis
    only, which onnxruntime's fused ops take as a 1-D bias; else why not."""
    if bias is None:
        return None
    value, hidden = constant_value(bias), shape.dims[-1]
    where = f"{add.name}'s bias {bias.name!r} of shape {list(value.shape)}"
    if not isinstance(hidden, int):
        return Decline(f"{where}: the last axis of {dims_list(shape)} is not static")
    leading_ones = all(d == 1 for d in value.shape[:-1])
    if value.ndim > shape.rank or not leading_ones or value.shape[-1:] not in ((), (1,), (hidden,)):
        return Decline(f"{where} does not broadcast over the last axis [{hidden}] alone of {dims_list(shape)}")
    if value.dtype != dtype:
        return Decline(f"{where} has dtype {value.dtype}, the input {dtype}")
    return None


def bias_tensor(g: GraphEditor, bias: gs.Tensor, hidden: int) -> gs.Tensor:
    """The bias as the 1-D [hidden] tensor onnxruntime requires (a new constant when reshaped)."""
    value = constant_value(bias)
    if value.shape == (hidden,):
        return bias
    return g.constant(f"{bias.name}_1d", np.broadcast_to(value.reshape(-1), (hidden,)).astype(value.dtype))


def schema_attribute(node: gs.Node, name: str, opset: int) -> float | None:
    """A node's float attribute, else the default its operator's schema declares at `opset`
    (None when the schema has no such attribute or no default)."""
    if name in node.attrs:
        return float(node.attrs[name])
    attr = defs.get_schema(node.op, opset).attributes.get(name)
    if attr is None or not attr.default_value.type:
        return None
    return float(helper.get_attribute_value(attr.default_value))




def gates_itself(x: gs.Tensor, first: gs.Node, depth: int = 4) -> bool:
    """Whether `x` gates what `first`, one of its readers, computes from it: a Mul that also reads
    `x` is reached from `first`'s outputs within `depth` nodes, as in the self-gated activations
    x * f(x): hard swish written x * relu6(x + 3) / 6 (paddle2onnx), SiLU, decomposed GELU. There
    `first` (hard swish's + 3, GELU's / sqrt(2)) is the activation's own arithmetic, not a bias or
    a scale of x's producer; and x, read again by the gate, cannot be folded away anyway."""
    others = {id(node) for node in x.outputs if node is not first and node.op == "Mul"}
    frontier = [first]
    for _ in range(depth):
        if not others or not frontier:
            return False
        frontier = [reader for node in frontier for out in node.outputs for reader in out.outputs]
        if any(id(node) in others for node in frontier):
            return True
    return False
