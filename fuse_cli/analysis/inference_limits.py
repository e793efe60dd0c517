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
    # each protobuf field read once (a wrapper per read: reading them per use cost 0.13 s on a
    # 2,940-node stack, more than the inference itself)
    protos = list(graph.node)
    nodes = [(n.op_type if n.domain in ("", "ai.onnx") else "", tuple(n.input), tuple(n.output)) for n in protos]
    long_vectors = _long_vectors(graph, {name for op, inputs, _ in nodes if op in _PROPAGATING for name in inputs})
    if long_vectors:
        name, length = next(iter(long_vectors.items()))
        return f"{name} has {length} elements"

    sizing = {i: (inputs[:3] if op == "Range" else inputs[_VALUE_SHAPED[op]:_VALUE_SHAPED[op] + 1])
              for i, (op, inputs, _) in enumerate(nodes) if op == "Range" or op in _VALUE_SHAPED}
    if not sizing:
        return None
    shapes = _StaticShapes(graph)
    opset = next((o.version for o in inferred.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = initial_values(list(graph.initializer))
    evaluate_shape_values([protos[i] for i in _feeding(nodes, sizing)], shapes.get, opset, values)
    for i, names in sizing.items():
        op, _, outputs = nodes[i]
        if not names or not all(name in values for name in names):
            continue
        if op == "Range":
            count = _range_count(*(values[name] for name in names))
            if count is not None and count > MAX_LENGTH:
                return f"{outputs[0]} would hold {count} values"
            continue
        value = np.asarray(values[names[0]]).reshape(-1)
        if value.size > MAX_LENGTH:
            return f"{outputs[0]} would have rank {value.size}"
        # the length of a 1-D output, which data propagation would then carry element by element
        # (a 1-D Pad has two pads)
        length = sum(abs(int(v)) for v in value)  # python ints: abs(int64 min) wraps in numpy
        if value.size <= (2 if op == "Pad" else 1) and length > MAX_LENGTH:
            return f"{outputs[0]} would be {length} long"
    return None


def _long_vectors(graph: onnx.GraphProto, names: set[str]) -> dict[str, int]:
    """Those of `names` that are 1-D tensors longer than MAX_LENGTH, with their lengths."""
    found = {t.name: t.dims[0] for t in graph.initializer
             if t.name in names and len(t.dims) == 1 and t.dims[0] > MAX_LENGTH}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if vi.name in names:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 1 and dims[0].dim_value > MAX_LENGTH:
                found[vi.name] = dims[0].dim_value
    return found


class _StaticShapes:
    """A tensor's shape where all its dims are known, read on first ask (only Shape and Size
    nodes feeding a size ask)."""

    def __init__(self, graph: onnx.GraphProto):
        self._graph = graph
        self._infos: dict | None = None

    def get(self, name: str) -> tuple[int, ...] | None:
        if self._infos is None:
            graph = self._graph
            self._infos = {vi.name: vi for vi in (*graph.input, *graph.value_info, *graph.output)}
            self._infos.update((t.name, t) for t in graph.initializer)
        info = self._infos.get(name)
        if isinstance(info, onnx.TensorProto):
            return tuple(info.dims)
        if info is None or not info.type.tensor_type.HasField("shape"):
            return None
        dims = info.type.tensor_type.shape.dim
        return tuple(d.dim_value for d in dims) if all(d.HasField("dim_value") for d in dims) else None


def _feeding(nodes: list[tuple[str, tuple, tuple]], sizing: dict[int, tuple]) -> list[int]:
    """The indices of the nodes whose values reach a size-giving input, in graph order."""
    producer = {name: i for i, (_, _, outputs) in enumerate(nodes) for name in outputs if name}
    pending = [name for names in sizing.values() for name in names]
    needed: set[int] = set()
    while pending:
        i = producer.get(pending.pop())
        if i is None or i in needed:
            continue
        needed.add(i)
        if nodes[i][0] not in ("Shape", "Size"):  # their value is the input's shape, not its value
            pending.extend(nodes[i][1])
    return sorted(needed)


def _range_count(start, limit, delta) -> int | None:
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in (start, limit, delta))
    if delta == 0 or not all(np.isfinite([start, limit, delta])):
        return None
    return max(int(np.ceil((limit - start) / delta)), 0)
