"""Fresh dim names declared on a tensor's value_info, and taken back: what unhold-buffers tries so
that onnxruntime's allocation planner, which reuses a buffer only for a tensor of provably the same
size, stops holding a dead buffer across the peak (the planner's shapes: analysis/planner_shapes.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import onnx
from onnx import helper


@dataclass(frozen=True)
class Declared:
    tensor: str
    replaced: tuple[onnx.ValueInfoProto, ...]  # the tensor's value_info as it was


def declare_fresh_dims(model: onnx.ModelProto, tensor: str, planner, prefix: str = "unheld") -> Declared | None:
    """`tensor`'s value_info with each dim the planner has no value for named afresh (PREFIX_N);
    None where every dim has a value (nothing to rename) or it is a graph output (its declared
    shape is the model's interface)."""
    graph = model.graph
    info = planner.get(tensor)
    if (info is None or info.shape is None or all(isinstance(d, int) for d in info.shape)
            or any(o.name == tensor for o in graph.output)):
        return None
    taken = {d.dim_param for vi in (*graph.input, *graph.output, *graph.value_info)
             if vi.type.HasField("tensor_type") for d in vi.type.tensor_type.shape.dim if d.dim_param}
    fresh = (name for k in itertools.count() if (name := f"{prefix}_{k}") not in taken)
    dims = [d if isinstance(d, int) else next(fresh) for d in info.shape]
    return _declare(graph, helper.make_tensor_value_info(tensor, info.elem_type, dims))


def declare_as(model: onnx.ModelProto, tensor: str, planner) -> Declared | None:
    """`tensor`'s value_info with the planner's own dims; None where one is unknown: what keeps the
    dims downstream of a renamed tensor as they were (onnxruntime's merge keeps a declared name
    where its inference would lose it)."""
    info = planner.get(tensor)
    if info is None or info.shape is None or None in info.shape:
        return None
    return _declare(model.graph, helper.make_tensor_value_info(tensor, info.elem_type, list(info.shape)))


def undeclare(model: onnx.ModelProto, declared: Declared) -> None:
    _without(model.graph, declared.tensor)
    model.graph.value_info.extend(declared.replaced)


def _declare(graph: onnx.GraphProto, value: onnx.ValueInfoProto) -> Declared:
    """`value` as its tensor's only declaration, the ones it replaces kept for undeclare."""
    replaced = _without(graph, value.name)
    graph.value_info.append(value)
    return Declared(value.name, replaced)


def _without(graph: onnx.GraphProto, tensor: str) -> tuple[onnx.ValueInfoProto, ...]:
    """Removes `tensor`'s declarations from graph.value_info; returns them."""
    removed = tuple(vi for vi in graph.value_info if vi.name == tensor)
    if removed:
        kept = [vi for vi in graph.value_info if vi.name != tensor]
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return removed
