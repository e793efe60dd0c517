"""The residual Add + LayerNormalization pairs onnxruntime's level-2 SkipLayerNormFusion may take:
the LayerNormalization reads an Add of two computed tensors of rank 3, and the fusion checks that
onnxruntime's shapes of the two are the same, dim for dim (a dim named alike, or of one value)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from fuse_cli.analysis.planner_shapes import planner_shapes


@dataclass(frozen=True)
class Residual:
    sum: str  # the Add's output, which the LayerNormalization reads
    operands: tuple[str, str]


def residuals(graph: onnx.GraphProto) -> list[Residual]:
    """Each LayerNormalization (the standard one) whose input is an Add of two tensors, the sum
    read by it alone and not a graph output: onnxruntime's fusion takes no other."""
    producer = {o: n for n in graph.node for o in n.output}
    readers = Counter(name for node in graph.node for name in node.input)
    outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        add = producer.get(node.input[0])
        if (add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2
                or not all(add.input) or readers.get(add.output[0]) != 1 or add.output[0] in outputs):
            continue
        found.append(Residual(add.output[0], (add.input[0], add.input[1])))
    return found


def same_shape(planner: Mapping, residual: Residual) -> bool:
    """Both operands of rank 3 and of one shape, every dim known (a value or a name), as
    onnxruntime's inference leaves them (`planner`: analysis/planner_shapes.py's shapes): what its
    fusion checks. Elsewhere it makes no SkipLayerNormalization."""
    shapes = [planner.get(name) for name in residual.operands]
    if any(info is None or info.shape is None for info in shapes):
        return False
    first, second = (tuple(info.shape) for info in shapes)
    return len(first) == 3 and None not in first and first == second


def fused_by_onnxruntime(model: onnx.ModelProto) -> list[Residual]:
    """The residuals onnxruntime's level-2 optimizer would turn into SkipLayerNormalization."""
    found = residuals(model.graph)
    if not found:
        return []
    planner = planner_shapes(model)
    return [r for r in found if same_shape(planner, r)]
