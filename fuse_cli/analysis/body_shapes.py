"""Shapes of the tensors inside If branches and Loop/Scan bodies, for the checks of passes that run
there. The shape tables (shape_tables.py) hold the main graph's tensors only: the memory audit and
the peak guard look at that level.

onnx's inference writes a body's value_info as it infers the node that holds it. A dim is kept
where onnx proves it: a number, or a symbol the model's inputs declare (onnx carries a symbol only
through operators that keep that dim). Symbols onnx makes up for what it cannot infer (`unk__3`)
and dims it leaves empty are unknown: they prove nothing.
"""

from __future__ import annotations

import onnx

Dim = int | str | None


def has_bodies(graph: onnx.GraphProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for node in graph.node for a in node.attribute)


def body_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[Dim, ...] | None]]:
    """(element type, shape) of every tensor declared inside a body, by name; empty for a model
    without bodies. Inference failing leaves what the bodies themselves declare."""
    if not has_bodies(model.graph):
        return {}
    # What an exporter declares inside a body is not evidence: torch writes the sizes of the trace
    # it exported (batch 1 where the model takes any batch: a Squeeze of that dim would pass for
    # exact). Only what onnx infers from the graph's own inputs is kept.
    undeclared = onnx.ModelProto()
    undeclared.CopyFrom(model)
    for body in _bodies(undeclared.graph):
        del body.value_info[:]
        for output in body.output:
            if output.type.HasField("tensor_type"):
                output.type.tensor_type.ClearField("shape")
    try:
        # No data propagation: it may materialize computed values (a ConstantOfShape of a large
        # computed shape), and body checks need types, not values.
        inferred = onnx.shape_inference.infer_shapes(undeclared, strict_mode=False, data_prop=False).graph
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError, ValueError):
        inferred = model.graph
    declared = {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    found: dict[str, tuple[int, tuple[Dim, ...] | None]] = {}
    ambiguous: set[str] = set()
    for body in _bodies(inferred):
        seen = {vi.name: (vi.type.tensor_type.elem_type, _shape(vi.type.tensor_type, declared))
                for vi in (*body.input, *body.output, *body.value_info) if vi.type.HasField("tensor_type")}
        seen.update((t.name, (t.data_type, tuple(t.dims))) for t in body.initializer)
        for name, info in seen.items():
            # sibling bodies may use one name for different values (optimum's merged decoders:
            # the same decoder with and without a cache in the two branches): no proof for either
            if found.setdefault(name, info) != info:
                ambiguous.add(name)
    return {name: (found[name][0], None) if name in ambiguous else found[name] for name in found}


def _shape(tensor_type: onnx.TypeProto.Tensor, declared: set[str]) -> tuple[Dim, ...] | None:
    if not tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in tensor_type.shape.dim:
        kind = d.WhichOneof("value")
        if kind == "dim_value" and d.dim_value >= 0:
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param if kind == "dim_param" and d.dim_param in declared else None)
    return tuple(dims)


def _bodies(graph: onnx.GraphProto):
    """Every body nested in `graph`, at any depth (not `graph` itself)."""
    for node in graph.node:
        for attr in node.attribute:
            for body in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield body
                yield from _bodies(body)
