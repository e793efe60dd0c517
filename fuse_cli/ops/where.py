"""Where (standard): its scratch on the CPU provider.

Where (cpu/tensor/where_op.cc) broadcasts in two steps: condition with X into a selection
tensor, condition with Y into another, both allocated from the kernel's tensor allocator and
held until it returns, then merges them into the output. Measured on onnxruntime 1.31.1
(tests/test_analysis_measure.py); it is the attention mask guard of torch's dynamo exports
(Where(IsNaN(softmax), 0, softmax)), which left hf-vit-tiny's dynamo export at 0.85x.
"""

from __future__ import annotations

import math

import onnx

from fuse_cli.core.tensors import element_size_bits
from fuse_cli.ops.record import Operator, Shapes
from fuse_cli.ops.rules import broadcast_static


def _selections(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """broadcast(condition, X) plus broadcast(condition, Y) elements of the output's type, in
    bytes; 0 when unknown."""
    infos = [shapes.get(name) for name in node.input[:3]]
    out = shapes.get(node.output[0])
    if len(infos) < 3 or out is None or any(i is None or i.shape is None or not all(isinstance(d, int) for d in i.shape)
                                            for i in infos):
        return 0
    bits = element_size_bits(out.elem_type)
    if bits is None or bits % 8:
        return 0
    condition = infos[0].shape
    return bits // 8 * sum(math.prod(broadcast_static(condition, values.shape)) for values in infos[1:])


RECORDS = (Operator("Where", workspace=_selections),)
