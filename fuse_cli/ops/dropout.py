"""Dropout (standard): a view of its input before opset 12 (IdentityOp<true>); from opset 12 a
real kernel that fills a mask even without a mask output: one byte per element (cpu/nn/dropout_op.h)."""

from __future__ import annotations

import math

import onnx

from fuse_cli.ops.record import Operator, Shapes


def _unrequested_mask(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    if opset < 12 or (len(node.output) >= 2 and node.output[1]):
        return 0
    info = shapes.get(node.input[0])
    if info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape):
        return math.prod(info.shape)  # a bool per element
    return 0


RECORDS = (Operator("Dropout", workspace=_unrequested_mask, view_opsets=(1, 11)),)
