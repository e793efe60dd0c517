"""Conv (standard): its scratch on the CPU provider, which FusedConv shares."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import onnx
from onnx import TensorProto

from fuse_cli.ops.record import Operator, Shapes
from fuse_cli.ops.rules import attributes

# MLAS_SGEMM_STRIDEN * MLAS_SGEMM_STRIDEK floats: the im2col tile of one thread.
_MLAS_CONV_TILE_BYTES = 128 * 128 * 4


def conv_workspace(node: onnx.NodeProto, shapes: Shapes, opset: int = 0) -> int:
    """MlasConvPrepare's working buffer for one intra-op thread, in bytes (convolve.cpp, float
    only): nothing for a pointwise conv (1x1 kernel, stride 1, no padding); the whole im2col matrix
    (output pixels x K floats) when the filters per group outnumber the output pixels; else one
    128x128-float tile (64 KiB) per thread."""
    x, w = (shapes.get(name) for name in (list(node.input) + ["", ""])[:2])
    y = shapes.get(node.output[0])
    infos = (x, w, y)
    if any(i is None or i.shape is None or not all(isinstance(d, int) for d in i.shape) for i in infos):
        return 0
    if x.elem_type != TensorProto.FLOAT or len(x.shape) < 3:
        return 0
    attrs = attributes(node)
    spatial_in, spatial_out = x.shape[2:], y.shape[2:]
    rank = len(spatial_in)
    group = int(attrs.get("group", 1)) or 1
    kernel = list(attrs.get("kernel_shape") or w.shape[2:])
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    pads = _conv_pads(attrs, spatial_in, spatial_out, kernel, strides, dilations)
    channels, filters = x.shape[1] // group, w.shape[0] // group
    k = channels * math.prod(kernel)
    pixels = math.prod(spatial_out)
    if rank > 3:
        return 4 * k * pixels  # the generic im2col path
    if all(s == 1 for s in strides) and not any(pads):
        if k == channels:
            return 0  # pointwise: GEMM straight on the input
        if rank <= 2 and all(d == 1 for d in dilations) and channels == 1:
            # MLAS promotes 1-D to 2-D (height 1); a kernel spanning the input's width, or its
            # whole height with width 1, is a direct GEMM too.
            in2, k2 = ([1, *spatial_in], [1, *kernel]) if rank == 1 else (spatial_in, kernel)
            if k2[1] == in2[1] or (k2[0] == in2[0] and k2[1] == 1):
                return 0
    if filters > pixels:
        return 4 * k * pixels
    return _MLAS_CONV_TILE_BYTES


def _conv_pads(attrs: Mapping, spatial_in: Sequence[int], spatial_out: Sequence[int],
               kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [
            max(0, (o - 1) * s + (k - 1) * d + 1 - i)
            for i, o, k, s, d in zip(spatial_in, spatial_out, kernel, strides, dilations)
        ]
    if auto_pad == "VALID":
        return [0] * len(spatial_in)
    return list(attrs.get("pads") or [0] * 2 * len(spatial_in))


RECORDS = (Operator("Conv", workspace=conv_workspace),)
