"""Element sizes by onnx type, and the sizes of what a model carries."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import onnx
from onnx import TensorProto, helper


def _bits_by_name(names: Iterable[str], bits: int) -> dict[int, int]:
    # getattr: the oldest onnx we support (1.16) lacks some of the newer types.
    return {getattr(TensorProto, n): bits for n in names if hasattr(TensorProto, n)}


# Types whose numpy mapping is missing or misleading in some onnx versions (older releases map
# float8 to uint8 and int4 to int8, which would make int4 a byte per element instead of a nibble).
_EXPLICIT_BITS: dict[int, int] = {
    **_bits_by_name(
        ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0"], 8
    ),
    **_bits_by_name(["FLOAT6E2M3", "FLOAT6E3M2"], 6),
    **_bits_by_name(["INT4", "UINT4", "FLOAT4E2M1"], 4),
    **_bits_by_name(["INT2", "UINT2"], 2),
    TensorProto.BFLOAT16: 16,
}


@functools.lru_cache(maxsize=None)
def element_size_bits(elem_type: int) -> int | None:
    """Bits one element of `elem_type` takes in a packed tensor; None for strings and unknowns."""
    if elem_type in _EXPLICIT_BITS:
        return _EXPLICIT_BITS[elem_type]
    if elem_type in (TensorProto.UNDEFINED, TensorProto.STRING):
        return None
    try:
        np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    except (KeyError, ValueError, TypeError):
        return None
    if np_dtype.kind == "O":
        return None
    return np_dtype.itemsize * 8


def payload_bytes(tensor: onnx.TensorProto) -> int | None:
    """A tensor's data size from its dims and type, without reading the data (ByteSize() or
    len(raw_data) on an 800 MB weight scan or copy it); None for strings and unknown types.
    Sub-byte types are packed: rounded up once, not per element."""
    bits = element_size_bits(tensor.data_type)
    return None if bits is None else (math.prod(tensor.dims) * bits + 7) // 8


def weight_bytes(model: onnx.ModelProto) -> int:
    """Initializers plus Constant nodes' values: what the model carries, not what it computes."""
    total = sum(payload_bytes(t) or 0 for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    total += payload_bytes(attr.t) or 0
    return total
