"""QDQ node units: a node a quantizer wrapped in DequantizeLinear -> node -> QuantizeLinear.

onnxruntime's optimizer turns each unit into one quantized kernel (QLinearConv, QLinearMatMul, ...)
at ORT_ENABLE_EXTENDED where it has one, and runs the node in float between the pairs where it
has none. Fusing the node into a com.microsoft operator hides the unit from it (a QDQ Conv + Relu
fused to FusedConv runs in float: benchmarks/results/quantized.md), and folding a node into a
neighbour across a pair moves a quantization step (not exact). So the passes leave a unit alone.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.pipeline.base import Decline

DEQUANTIZE = "DequantizeLinear"
QUANTIZE = "QuantizeLinear"


# why a pass that would turn a quantized node into a float com.microsoft operator leaves it
TO_ONNXRUNTIME = ("onnxruntime turns the unit into its quantized kernel itself (at ORT_ENABLE_EXTENDED); "
                  "fused here, it would run in float")


def _producer(tensor: gs.Tensor | None) -> gs.Node | None:
    return tensor.inputs[0] if tensor is not None and tensor.inputs else None


def qdq_unit_reason(node: gs.Node, g: GraphEditor, *, why: str) -> Decline | None:
    """Why `node` stays as the quantizer wrote it, or None where no input of it comes from a
    DequantizeLinear and no output goes to a QuantizeLinear. `why`: what a rewrite would break,
    and what the user can do."""
    dequantized = [t for t in node.inputs if getattr(_producer(t), "op", None) == DEQUANTIZE]
    quantized = [out for out in node.outputs if any(reader.op == QUANTIZE for reader in out.outputs)]
    if not dequantized and not quantized:
        return None
    parts = []
    if dequantized:
        parts.append("reads " + ", ".join(f"{t.name!r}" for t in dequantized[:3]) + " from DequantizeLinear"
                     + (f" (and {len(dequantized) - 3} more)" if len(dequantized) > 3 else ""))
    if quantized:
        parts.append(f"its output {quantized[0].name!r} goes to QuantizeLinear")
    return Decline(f"{node.name} is inside a QDQ node unit ({'; '.join(parts)}): {why}")
