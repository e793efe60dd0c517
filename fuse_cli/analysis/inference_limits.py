"""Whether a shape inference that computes values may run on a model without a size cap of its own.

onnx's data propagation keeps every element of a 1-D value as a protobuf dimension (~160 bytes
each, measured: 665 MB for one Add reading a 1-D tensor of 2**22 elements), and onnxruntime's
symbolic inference computes an int64 ConstantOfShape with numpy. Neither has a limit: a model of
143 bytes whose ConstantOfShape reads a computed [2**24] took 2.5 GB in onnx's inference alone.

The check runs on the model after inference *without* values (cheap, and it cannot allocate
more than the model declares), evaluates the small shape arithmetic with numpy (shape_values.py,
at most MAX_ELEMENTS per value) and refuses when a length, a rank or a count that either
inference would materialize is above MAX_LENGTH. What it cannot compute, neither inference can
(both need the same concrete values), so a refusal is never needed for an unknown.
"""

from __future__ import annotations

import numpy as np
import onnx

from fuse_cli.analysis.shape_values import evaluate_shape_values, initial_values

# Far above any real shape value's length (ranks, pads, shapes), far below what hurts: 2**16
# elements cost onnx's data propagation ~10 MB.
MAX_LENGTH = 2**16

# onnx operators with a data propagation function (onnx 1.23's schemas), and the inputs of the
# operators whose output length, rank or value count is read from another tensor's value.
_PROPAGATING = frozenset({"Add", "Cast", "Concat", "Gather", "Mul", "Shape", "Size", "Slice", "Squeeze", "Sub",
                          "Unsqueeze"})
_VALUE_SHAPED = {"ConstantOfShape": 0, "Expand": 1, "Tile": 1, "Reshape": 1, "OneHot": 1, "Pad": 1}


def unbounded_value(inferred: onnx.ModelProto) -> str | None:
    """None when computing values is safe on `inferred` (a model after onnx's inference without
    data propagation); else which tensor would be too large, in words."""
    graph = inferred.graph
    types = {vi.name: vi.type.tensor_type for vi in (*graph.input, *graph.value_info, *graph.output)}
    static = {t.name: list(t.dims) for t in graph.initializer}

    def shape_of(name: str) -> tuple[int, ...] | None:
        if name in static:
            return tuple(static[name])
        tensor_type = types.get(name)
        if tensor_type is None or not tensor_type.HasField("shape"):
            return None
        dims = tensor_type.shape.dim
        return tuple(d.dim_value for d in dims) if all(d.HasField("dim_value") for d in dims) else None

    for node in graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in _PROPAGATING:
            for name in node.input:
                shape = shape_of(name) if name else None
                if shape is not None and len(shape) == 1 and shape[0] > MAX_LENGTH:
                    return f"{name} has {shape[0]} elements"

    opset = next((o.version for o in inferred.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = initial_values(list(graph.initializer))
    evaluate_shape_values(list(graph.node), shape_of, opset, values)
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Range":
            count = _range_count(node, values)
            if count is not None and count > MAX_LENGTH:
                return f"{node.output[0]} would hold {count} values"
            continue
        index = _VALUE_SHAPED.get(node.op_type)
        if index is None or len(node.input) <= index or node.input[index] not in values:
            continue
        value = np.asarray(values[node.input[index]]).reshape(-1)
        if value.size > MAX_LENGTH:
            return f"{node.output[0]} would have rank {value.size}"
        # the length of a 1-D output, which data propagation would then carry element by element
        # (a 1-D Pad has two pads)
        length = sum(abs(int(v)) for v in value)  # python ints: abs(int64 min) wraps in numpy
        if value.size <= (2 if node.op_type == "Pad" else 1) and length > MAX_LENGTH:
            return f"{node.output[0]} would be {length} long"
    return None


def _range_count(node: onnx.NodeProto, values) -> int | None:
    if len(node.input) < 3 or not all(name in values for name in node.input[:3]):
        return None
    start, limit, delta = (float(np.asarray(values[name]).reshape(-1)[0]) for name in node.input[:3])
    if delta == 0 or not all(np.isfinite([start, limit, delta])):
        return None
    return max(int(np.ceil((limit - start) / delta)), 0)
