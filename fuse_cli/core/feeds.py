"""Seeded random inputs for an onnxruntime session: the data verification, benchmarks and the
memory measurement feed a model."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fuse_cli.config import UNBOUND_DIM
from fuse_cli.errors import FuseError

DEFAULT_INT_RANGE = (0, 10)
MASK_RANGE = (0, 2)


def random_inputs(session, *, dims: Mapping[str, int] | None = None, seed: int = 0,
                  int_ranges: Mapping[str, tuple[int, int] | None] | None = None,
                  default_dim: int = UNBOUND_DIM) -> dict[str, np.ndarray]:
    """Seeded random data for every input, respecting dtype and shape. Symbolic dims come from
    `dims`, else `default_dim`; integers from `int_ranges[name]` (low inclusive, high exclusive;
    None: [0, the input's last dim), as position ids take), else 0..9, masks 0/1."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    int_ranges = int_ranges or {}
    feeds = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else dims.get(d, default_dim) if isinstance(d, str) else default_dim
                 for d in inp.shape]
        dtype = numpy_dtype(inp.type)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            span = int_ranges.get(inp.name, MASK_RANGE if "mask" in inp.name.lower() else DEFAULT_INT_RANGE)
            low, high = span if span is not None else (0, max(1, shape[-1] if shape else 1))
            feeds[inp.name] = rng.integers(low, high, shape).astype(dtype)
    return feeds


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def numpy_dtype(ort_type: str) -> np.dtype:
    if ort_type not in _ORT_TYPES:
        raise FuseError(f"cannot make random data for an input of type {ort_type}; pass real inputs")
    return np.dtype(_ORT_TYPES[ort_type])
