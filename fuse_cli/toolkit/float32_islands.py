"""Float32 islands: a float16 node of an operator that onnxruntime's CPU provider would run as its
function body (targets.FLOAT16_BODY_ON_CPU: Gelu, FastGelu, QuickGelu) gets explicit Casts to
float32 and back, so its float32 kernel runs.

Why: at float16 the CPU provider inlines such an operator's function body, the very nodes a
fusion replaced, rather than casting around its float32 kernel as it does for MultiHeadAttention or
FusedMatMul (tests/test_targets.py probes each record). The nodes a GELU fusion replaces ran in
float32 between Casts the provider inserted (the engine emits only then: targets.emit_reason), so
writing those Casts ourselves computes what they computed, in one kernel instead of the body.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor


def island(g: GraphEditor, node: gs.Node) -> list[gs.Node]:
    """`node` reading and writing float32, with a Cast before each float16 input it reads
    (a float16 constant becomes a float32 one instead) and a Cast back to each float16 output it
    writes, which keeps the tensor (so its readers and a graph output keep their name)."""
    nodes: list[gs.Node] = []
    widened: list[gs.Tensor] = []
    for tensor in node.inputs:
        if g.dtype(tensor) != np.float16:
            widened.append(tensor)
        elif isinstance(tensor, gs.Constant):
            widened.append(g.constant(f"{tensor.name}_float32", np.asarray(tensor.values, np.float32)))
        else:
            wide = gs.Variable(g.unique_name(f"{tensor.name}_float32"), dtype=np.float32, shape=tensor.shape)
            nodes.append(g.node("Cast", [tensor], {"to": onnx.TensorProto.FLOAT}, name=f"{node.name}_widen",
                                outputs=[wide]))
            widened.append(wide)
    written = list(node.outputs)
    node.inputs.clear()
    node.inputs.extend(widened)
    node.outputs.clear()
    narrowing: list[gs.Node] = []
    for tensor in written:
        if g.dtype(tensor) != np.float16:
            node.outputs.append(tensor)
            continue
        wide = gs.Variable(g.unique_name(f"{tensor.name}_float32"), dtype=np.float32, shape=tensor.shape)
        node.outputs.append(wide)
        narrowing.append(g.node("Cast", [wide], {"to": onnx.TensorProto.FLOAT16}, name=f"{node.name}_narrow",
                                outputs=[tensor]))
    return [*nodes, node, *narrowing]
