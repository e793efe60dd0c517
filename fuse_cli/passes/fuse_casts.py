"""Cast chains that lose nothing in the middle become one Cast; Casts to the input's own type go."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto as T

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Alt, Match, Op, Var
from fuse_cli.pipeline.base import Decline, PatternPass, Requirement
from fuse_cli.pipeline.registry import register

INTEGERS = {T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32, T.INT64, T.UINT64}
FLOATS = {T.FLOAT16, T.BFLOAT16, T.FLOAT, T.DOUBLE}

# a -> b holds every value of a exactly (ints within b's range or mantissa, floats widened)
EXACT = {
    T.BOOL: INTEGERS | FLOATS,
    T.INT8: {T.INT16, T.INT32, T.INT64} | FLOATS,
    T.UINT8: {T.UINT16, T.UINT32, T.UINT64, T.INT16, T.INT32, T.INT64} | FLOATS,
    T.INT16: {T.INT32, T.INT64, T.FLOAT, T.DOUBLE},
    T.UINT16: {T.UINT32, T.UINT64, T.INT32, T.INT64, T.FLOAT, T.DOUBLE},
    T.INT32: {T.INT64, T.DOUBLE},
    T.UINT32: {T.UINT64, T.INT64, T.DOUBLE},
    T.FLOAT16: {T.FLOAT, T.DOUBLE},
    T.BFLOAT16: {T.FLOAT, T.DOUBLE},
    T.FLOAT: {T.DOUBLE},
}


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """A lone Cast is this pattern only when it casts to its input's own type."""
    if "first" in m.nodes:
        return True
    return _elem_type(g, m.tensor("x")) == _to(m.node("cast"))


@register
class FuseCasts(PatternPass):
    """x:a ── Cast(to=b) ── Cast(to=c) ── y   =>   x ── Cast(to=c) ── y
       x:a ── Cast(to=a) ── y                =>   readers of y read x

    Exact when a -> b is exact for every value of a (f16 -> f32, int8 -> int32, uint8 -> f16):
    then b -> c sees the very values a -> c would. Never when the middle cast rounds or wraps
    (f32 -> f16 -> f32 loses precision, f32 -> i32 -> f32 truncates). One more case: an integer
    through a float into an integer type narrower than a, where a -> c wraps but float -> c
    does not, is kept. A chain a -> b -> a that is exact ends as Cast(to=a), removed next round.
    """

    name = "fuse-casts"
    description = "Merge exact Cast chains and remove Casts to the input's own type"
    label = "Cast + Cast / same-type Cast"
    min_opset = 6  # `to` is an enum from opset 6 (a string before)
    pattern = Op("Cast", Alt(Op("Cast", Var("x"), name="first"), Var("x")), name="cast")

    requires = (Requirement(
        "A lone Cast is this pattern only when it casts to its input's own type.",
        _is_this_pattern),)

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        cast = m.node("cast")
        a, c = _elem_type(g, m.tensor("x")), _to(cast)
        if "first" not in m.nodes:
            return Decline.unless(g.reroute_reason(cast.outputs[0], m.tensor("x")))
        first, b = m.node("first"), _to(m.node("first"))
        if a is None:
            return Decline(f"{first.name}'s input type is unknown, "
                           f"so {first.name} -> {cast.name} cannot be shown exact")
        if a != b and b not in EXACT.get(a, ()):
            return Decline(f"{first.name} casts {_name(a)} to {_name(b)}, which loses values: "
                           f"{cast.name} cannot skip it")
        if a in INTEGERS and b in FLOATS and c in INTEGERS and c != a and c not in EXACT[a]:
            return (Decline(f"{_name(a)} -> {_name(c)} wraps out-of-range values but {_name(b)} -> {_name(c)} "
                    f"does not: {first.name} -> {cast.name} cannot become one Cast"))
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        cast = m.node("cast")
        if "first" not in m.nodes:
            return Replacement(reroute=[(cast.outputs[0], m.tensor("x"))])
        fused = rebuilt(cast, inputs=[m.tensor("x")], outputs=[cast.outputs[0]])
        return Replacement(nodes=[fused])


def _to(cast: gs.Node) -> int:
    to = cast.attrs["to"]
    return onnx.TensorProto.DataType.Value(to.upper()) if isinstance(to, str) else int(to)  # a name before opset 6


def _elem_type(g: GraphEditor, tensor: gs.Tensor) -> int | None:
    dtype = g.dtype(tensor)
    if dtype is None:
        return None
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(dtype)
    except (KeyError, TypeError, ValueError):
        return None


def _name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type).lower()
