"""LRN (standard): its scratch on the CPU provider.

LRN on float (cpu/nn/lrn.cc) takes two buffers from the temp-space allocator: the scale, as big
as its input, and one image's padded squares, (C + size - 1) x H x W floats. Measured on
onnxruntime 1.31.1 at [4, 64, 64, 64]: input + output + 5.06 MiB (tests/test_analysis_measure.py);
it was what kept the zoo's inception_v1 at 0.67x (192 channels at 55 x 55: 4.4 MiB).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from fuse_cli.ops.record import Operator, Shapes


def _scale_and_squares(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The scale and one image's padded squares, in bytes; 0 when unknown."""
    info = shapes.get(node.input[0])
    if (info is None or info.elem_type != TensorProto.FLOAT or info.shape is None or len(info.shape) != 4
            or not all(isinstance(d, int) for d in info.shape)):
        return 0
    size = next((a.i for a in node.attribute if a.name == "size"), 1)
    batch, channels, height, width = info.shape
    return 4 * (batch * channels + channels + size - 1) * height * width


RECORDS = (Operator("LRN", workspace=_scale_and_squares),)
