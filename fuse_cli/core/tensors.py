"""Sizes of what a model carries."""

from __future__ import annotations

import onnx

from fuse_cli.analysis.shapes import element_size_bits


def tensor_bytes(tensor: onnx.TensorProto) -> int:
    bits = element_size_bits(tensor.data_type) or 0
    count = 1
    for dim in tensor.dims:
        count *= dim
    return (count * bits + 7) // 8


def weight_bytes(model: onnx.ModelProto) -> int:
    """Initializers plus Constant nodes' values: what the model carries, not what it computes."""
    total = sum(tensor_bytes(t) for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    total += tensor_bytes(attr.t)
    return total
