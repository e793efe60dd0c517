"""What the operators' shape and memory rules share."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from fuse_cli.ops.record import Shapes


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def static_shape(shapes: Shapes, name: str) -> tuple[int, ...] | None:
    """`name`'s shape when every dim is a number, else None."""
    info = shapes.get(name) if name else None
    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
        return None
    return info.shape


def recurrent_sizes(node: onnx.NodeProto, shapes: Shapes) -> tuple[int, int, int, int, int] | None:
    """(steps, batch, features, hidden, directions) of a float32 LSTM/GRU/RNN over a static
    [S, B, I] sequence in the default layout; None otherwise (its buffers are then not modelled)."""
    x = shapes.get(node.input[0])
    if x is None or x.elem_type != onnx.TensorProto.FLOAT or x.shape is None or len(x.shape) != 3 \
            or not all(isinstance(d, int) for d in x.shape):
        return None
    attrs = attributes(node)
    hidden = int(attrs.get("hidden_size", 0))
    if hidden <= 0 or int(attrs.get("layout", 0)):
        return None
    directions = 2 if attrs.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    return (*x.shape, hidden, directions)


def broadcast_static(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def same_as_input_0(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """The stand-in of an operator whose output 0 has input 0's shape and type."""
    return [helper.make_node("Identity", node.input[:1], node.output[:1])]


def output_sized(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """Scratch of one output's worth."""
    return shapes.nbytes(node.output[0]) or 0


def float_operands(node: onnx.NodeProto, a: str, b: str) -> tuple[list[onnx.NodeProto], list[str]]:
    """Casts of the quantized operands `a` and `b` of `node` to float32, and the names they write:
    a stand-in of a quantized product computes it in float (only its shape and type matter)."""
    out = node.output[0]
    operands = [f"{out}::fuse-{side}-float" for side in ("a", "b")]
    return [helper.make_node("Cast", [name], [operand], to=onnx.TensorProto.FLOAT)
            for name, operand in zip((a, b), operands)], operands
