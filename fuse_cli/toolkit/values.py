"""Small integer values known before run time: constants, and the shape arithmetic exporters
write around them (Shape -> Gather -> Div -> Unsqueeze, torch's x.shape[-1] // 2)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import constant_value, producer_of

INT_MAX = 2**63 - 1


def int_value(t: gs.Tensor | None, g: GraphEditor, depth: int = 8) -> np.ndarray | None:
    """The integer value of `t` when it is a constant or computed from static dims through Shape,
    Gather, Unsqueeze/Squeeze/Reshape, Cast, Concat and integer Div/Mul/Add/Sub; None otherwise."""
    value = constant_value(t)
    if value is not None:
        return value if np.issubdtype(value.dtype, np.integer) else None
    node = producer_of(t) if t is not None else None
    if node is None or depth == 0:
        return None
    args = [int_value(i, g, depth - 1) for i in node.inputs[1:]]
    if node.op == "Shape":
        shape = g.shape(node.inputs[0])
        if shape is None:
            return None
        dims = shape.dims[node.attrs.get("start", 0):node.attrs.get("end", shape.rank)]
        return np.array(dims, np.int64) if all(isinstance(d, int) for d in dims) else None
    if node.op == "Gather" and args and args[0] is not None and node.attrs.get("axis", 0) == 0:
        shape_of = producer_of(node.inputs[0])
        if shape_of is not None and shape_of.op == "Shape":  # dims read one by one: only those must be static
            shape = g.shape(shape_of.inputs[0])
            start = shape_of.attrs.get("start", 0)
            dims = shape.dims[start:shape_of.attrs.get("end", shape.rank)] if shape is not None else ()
            picked = [dims[i] if -len(dims) <= i < len(dims) else None for i in args[0].reshape(-1)]
            return (np.array(picked, np.int64).reshape(args[0].shape)
                    if all(isinstance(d, int) for d in picked) else None)
    first = int_value(node.inputs[0], g, depth - 1) if node.inputs else None
    if first is None:
        return None
    if node.op == "Gather" and args and args[0] is not None and node.attrs.get("axis", 0) == 0 and first.ndim == 1:
        return first[args[0]]
    if node.op in ("Unsqueeze", "Squeeze", "Reshape", "Cast"):
        return first.reshape(-1) if node.op == "Unsqueeze" and first.ndim == 0 else (
            first.reshape(()) if node.op == "Squeeze" and first.size == 1 else first)
    if node.op == "Concat" and all(a is not None for a in args):
        return np.concatenate([first.reshape(-1)] + [a.reshape(-1) for a in args])
    ops = {"Div": np.floor_divide, "Mul": np.multiply, "Add": np.add, "Sub": np.subtract}
    if node.op in ops and len(args) == 1 and args[0] is not None and (node.op != "Div" or np.all(args[0] > 0)):
        return ops[node.op](first, args[0])
    return None
