"""Dims read from Shape(x) that are static become constants, even where other dims are symbolic."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import PatternPass, Requirement
from fuse_cli.pipeline.registry import register


def _integer_indices(value: np.ndarray) -> bool:
    return value.dtype in (np.int32, np.int64) and value.ndim <= 1


def _is_this_pattern(m: Match, g: GraphEditor) -> bool:
    """Reading a symbolic dim is what Shape is for: silent, not a near-miss."""
    dims = _selected_dims(m, g)
    picked = _picked(m, dims) if dims is not None else None
    return picked is not None and all(isinstance(d, int) for d in picked)


@register
class FoldStaticShapeDims(PatternPass):
    """x ── Shape ── Gather(i) ── d   =>   d = the constant dim(s) i of x, when they are static
       x ── Shape ── s                =>   s = x's shape, when every dim is static

    Exporters compute sizes from Shape even where the model fixes them (ShuffleNet's channels
    // 2, a ViT's patch count, an attention head size): with a symbolic batch, Shape(x) is not a
    constant, so constant folding cannot touch it, but Gather picks only static dims. Exact:
    the dims come from the shape proofs (ints that hold for every input shape, never a dim the
    user bound with --dim). Shape's start/end (opset 15) select the dims Gather indexes into;
    negative indices count from the end. The Shape node stays while anything else reads it.
    """

    name = "static-shape-dims"
    description = "Replace Gather(Shape(x), i) by a constant where dims i of x are static"
    label = "Shape + Gather (static dims)"
    pattern = Alt(Op("Gather", Op("Shape", Var("x"), name="shape"), Const(_integer_indices, name="indices"),
                     name="gather", axis=lambda v: v in (None, 0, -1)),
                  Op("Shape", Var("x"), name="shape"))  # every selected dim static (a Concat of 4 pieces)
    keeps = ("shape",)  # the rewrite re-creates Shape for its other readers

    requires = (Requirement(
        "Reading a symbolic dim is what Shape is for: silent, not a near-miss.",
        _is_this_pattern),)

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        shape = m.node("shape")
        if "gather" not in m.nodes:
            value = np.asarray(_selected_dims(m, g), dtype=np.int64)
            return Replacement(nodes=[g.node("Constant", [],
                                             {"value": gs.Constant(g.unique_name(f"{shape.name}_value"), value)},
                                             name=f"{shape.name}_static", outputs=[shape.outputs[0]])])
        gather = m.node("gather")
        indices = constant_value(m.tensor("indices"))
        # not g.constant: np.ascontiguousarray makes a scalar index's 0-d value 1-d
        value = np.asarray(_picked(m, _selected_dims(m, g)), dtype=np.int64).reshape(indices.shape)
        constant = g.node("Constant", [], {"value": gs.Constant(g.unique_name(f"{gather.name}_value"), value)},
                          name=f"{gather.name}_static", outputs=[gather.outputs[0]])
        again = rebuilt(shape, inputs=[m.tensor("x")], outputs=[shape.outputs[0]])
        return Replacement(nodes=[again, constant])


def _selected_dims(m: Match, g: GraphEditor) -> list | None:
    """The dims Shape outputs: all of x's, or those its start/end attributes select."""
    shape = g.shape(m.tensor("x"))
    if shape is None:
        return None
    attrs = m.node("shape").attrs
    return list(shape.dims)[slice(attrs.get("start", 0), attrs.get("end"))]


def _picked(m: Match, dims: list) -> list | None:
    if m.tensor("indices") is None:
        return dims
    indices = constant_value(m.tensor("indices")).reshape(-1).tolist()
    if any(not -len(dims) <= i < len(dims) for i in indices):
        return None
    return [dims[i] for i in indices]
