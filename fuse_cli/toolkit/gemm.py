"""What a MatMul's weight and an Add's bias must be to become Gemm's B and C (matmul-add, and
matmul-add-into-view, which reshapes around the Gemm)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.pipeline.base import Decline

GEMM_DTYPES = (np.float16, np.float32, np.float64)


def gemm_operands_reason(matmul: gs.Node, w: np.ndarray, bias: np.ndarray) -> Decline | None:
    """Why a Linear layer's weight and bias cannot be Gemm's B and C (None: they can)."""
    if w.ndim != 2:
        return Decline(f"{matmul.name}'s weight has rank {w.ndim}, Gemm needs rank 2")
    if w.dtype.type not in GEMM_DTYPES:
        return Decline(f"{matmul.name} computes in {w.dtype}; Gemm is used for float types only")
    n = w.shape[1]
    if bias.dtype != w.dtype:
        return Decline(f"the bias dtype {bias.dtype} differs from the weight dtype {w.dtype}")
    if not _broadcasts_over_last_dim(bias.shape, n):
        return Decline(f"the bias of shape {list(bias.shape)} does not broadcast over the last dimension [{n}] alone")
    return None


def _broadcasts_over_last_dim(shape: tuple[int, ...], n: int) -> bool:
    if len(shape) > 2:
        return False
    if len(shape) == 2 and shape[0] != 1:
        return False
    return not shape or shape[-1] in (1, n)
