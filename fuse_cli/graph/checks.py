"""Refusals of models no run could hold, before any work, and the one repair that is exact.

Each refusal is a one-line ModelLoadError (exit 2): sizes numpy cannot even represent crashed
deep inside the memory audit or verification (exit 3) before these checks.
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
from onnx import numpy_helper

from fuse_cli.errors import ModelLoadError
from fuse_cli.graph.walk import all_graphs

# numpy's most dimensions (onnxruntime's kernels and our random inputs go through numpy arrays)
MAX_RANK = 64
# 1 PiB: no machine holds such a tensor, and a sum of thousands of them still fits an int64
MAX_TENSOR_BYTES = 2**50
# A Constant's sparse_value is densified up to this; graphsurgeon cannot carry the attribute
MAX_DENSIFIED_BYTES = 64 * 2**20


def check_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Refuse what no run could hold, and densify Constant nodes' sparse values (in place)."""
    for graph in all_graphs(model.graph):
        for node in graph.node:
            own = set(node.input) & {name for name in node.output if name}
            if own:
                raise ModelLoadError(f"{path}: invalid graph: node {node.name or node.op_type!r} reads its own "
                                     f"output {sorted(own)[0]!r}")
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                _densify_sparse_value(node, path)
        for vi in (*graph.input, *graph.output, *graph.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
                check_tensor_size(vi.name, dims, path)
        for tensor in graph.initializer:
            check_tensor_size(tensor.name, list(tensor.dims), path)


def check_tensor_size(name: str, dims: list[int | None] | tuple, where: str | os.PathLike) -> None:
    """`dims`: ints where known. Refuses a rank above MAX_RANK, or known dims whose product alone
    (at least one byte an element) is above MAX_TENSOR_BYTES."""
    if len(dims) > MAX_RANK:
        raise ModelLoadError(f"{where}: tensor {name!r} has rank {len(dims)}; fuse handles at most {MAX_RANK}")
    known = [d for d in dims if isinstance(d, int) and d >= 0]  # a negative dim is read as unknown
    if math.prod(known) > MAX_TENSOR_BYTES:
        shape = "x".join("?" if d is None else str(d) for d in dims)
        raise ModelLoadError(f"{where}: tensor {name!r} of shape {shape} cannot be held (above 1 PiB)")


def _densify_sparse_value(node: onnx.NodeProto, path: str | os.PathLike) -> None:
    """graphsurgeon skips a sparse_value attribute ("currently unsupported"), which left a
    Constant without a value in the written model. The dense tensor is the same value."""
    for index, attribute in enumerate(node.attribute):
        if attribute.name != "sparse_value":
            continue
        sparse = attribute.sparse_tensor
        count = math.prod(sparse.dims)
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(sparse.values.data_type).itemsize
        if count * itemsize > MAX_DENSIFIED_BYTES:
            raise ModelLoadError(f"{path}: Constant {node.name or node.output[0]!r}'s sparse value is "
                                 f"{count * itemsize / 2**20:.0f} MB dense; fuse densifies at most 64 MB")
        try:
            dense = dense_from_sparse(sparse)
        except (ValueError, IndexError, TypeError) as exc:
            raise ModelLoadError(f"{path}: Constant {node.name or node.output[0]!r}: malformed sparse value "
                                 f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from exc
        del node.attribute[index]
        node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(dense, node.output[0])))
        return


def dense_from_sparse(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """The dense value (zeros where no index names an element); raises ValueError or IndexError
    for indices outside the dims or values and indices that do not pair up."""
    values = numpy_helper.to_array(sparse.values).reshape(-1)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    flat = indices.reshape(-1) if indices.ndim <= 1 else np.ravel_multi_index(tuple(indices.T), dims)
    if flat.size != values.size or (flat.size and (flat.min() < 0 or flat.max() >= math.prod(dims))):
        raise ValueError("indices do not name one element each within the dims")
    dense = np.zeros(math.prod(dims), values.dtype)
    dense[flat] = values
    return dense.reshape(dims)
