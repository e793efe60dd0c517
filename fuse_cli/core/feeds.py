"""Seeded random inputs for an onnxruntime session: the data verification, benchmarks and the
memory measurement feed a model."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fuse_cli.config import UNBOUND_DIM
from fuse_cli.errors import FuseError

DEFAULT_INT_RANGE = (0, 10)
MASK_RANGE = (0, 2)


def position_key(input_name: str, index: int) -> str:
    """The name that binds one position of one input (`x.dim2`): for a dim with no name, a
    placeholder name or -1, which no dim_param can bind on its own (input_domain.input_dim_keys)."""
    return f"{input_name}.dim{index}"


def value_key(input_name: str) -> str:
    """The name under which a setting fixes a bool input's value (`use_cache_branch.value`): the
    input that selects an If's branch takes each value across verification's settings."""
    return f"{input_name}.value"


def random_inputs(session, *, dims: Mapping[str, int] | None = None, seed: int = 0,
                  int_ranges: Mapping[str, tuple[int, int] | None] | None = None,
                  default_dim: int = UNBOUND_DIM) -> dict[str, np.ndarray]:
    """Seeded random data for every input, respecting dtype and shape. A free dim takes its
    position key's size in `dims` (position_key), else its name's, else `default_dim`; a bool
    input its value_key's value where `dims` has one; integers from `int_ranges[name]` (low
    inclusive, high exclusive; None: [0, the input's last dim), as position ids take), else 0..9,
    masks 0/1."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    int_ranges = int_ranges or {}
    feeds = {}
    for inp in session.get_inputs():
        shape = [_size(inp.name, index, d, dims, default_dim) for index, d in enumerate(inp.shape)]
        dtype = numpy_dtype(inp.type)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            chosen = dims.get(value_key(inp.name))
            feeds[inp.name] = (np.full(shape, bool(chosen)) if chosen is not None
                               else rng.integers(0, 2, shape).astype(np.bool_))
        else:
            span = int_ranges.get(inp.name, MASK_RANGE if "mask" in inp.name.lower() else DEFAULT_INT_RANGE)
            low, high = span if span is not None else (0, max(1, shape[-1] if shape else 1))
            feeds[inp.name] = rng.integers(low, high, shape).astype(dtype)
    return feeds


def _size(input_name: str, index: int, declared, dims: Mapping[str, int], default_dim: int) -> int:
    if isinstance(declared, int) and declared >= 0:
        return declared
    key = position_key(input_name, index)
    if key in dims:
        return dims[key]
    return dims.get(declared, default_dim) if isinstance(declared, str) else default_dim


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
