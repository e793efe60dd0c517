"""Attention head splits: a Reshape of [B, S, H*d] into [B, S, H, d], proved from a constant shape
or from the inferred shapes when the exporter computes the shape at run time (torch's dynamo)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Match, constant_value
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.shapes import same_dim, shape_entries


def head_split(reshape: gs.Node, g: GraphEditor) -> tuple[int, int] | None:
    """(H, d) when `reshape` takes a [B, S, H*d] tensor to [B, S, H, d]: its shape is a constant
    [0, 0|-1, H, d] (allowzero 0), or its inferred output is [B, S, H, d] with B and S provably
    the input's (row-major, the split into heads whatever computed the shape)."""
    source, out = g.shape(reshape.inputs[0]), g.shape(reshape.outputs[0])
    if source is None or source.rank != 3 or source.static(2) is None:
        return None
    dims = constant_value(reshape.inputs[1])
    if dims is not None:
        dims = [int(v) for v in dims.reshape(-1)]
        if (len(dims) == 4 and dims[0] == 0 and dims[1] in (0, -1) and min(dims[2:]) > 0
                and not reshape.attrs.get("allowzero", 0) and source.static(2) == dims[2] * dims[3]):
            return dims[2], dims[3]
        return None
    if (out is not None and out.rank == 4 and out.static(2) and out.static(3) and same_dim(out.dims[0], source.dims[0])
            and same_dim(out.dims[1], source.dims[1]) and out.static(2) * out.static(3) == source.static(2)):
        return out.static(2), out.static(3)
    return None


def softmax_key_axis_decline(softmax: gs.Node, opset: int) -> Decline | None:
    """Scores [B, H, S, T] must be normalized over the key axis: Softmax's axis -1 or 3 (its
    default is 1 before opset 13, where Softmax flattened the trailing axes)."""
    axis = softmax.attrs.get("axis", -1 if opset >= 13 else 1)
    return None if axis in (-1, 3) else Decline(f"{softmax.name} normalizes axis {axis}, not the key axis 3")


def flattened_key_t(m: Match, g: GraphEditor, d: int) -> bool:
    """Reshape(K [B, H, S, d], [-1, S, d]), Transpose [0, 2, 1], Reshape([B, H, d, S]) is K^T (torch
    dynamo's sdpa): the shape vectors read K's own dims (or give them statically). The match names
    key_flatten, key_flat_shape and key_unflat_shape."""
    k = m.node("key_flatten").inputs[0]
    dims = g.shape(k)
    if dims is None or dims.rank != 4:
        return False

    def is_dim(entry, axis: int) -> bool:
        return entry == (k, axis) or isinstance(entry, tuple) and entry[1] == axis and same_dim(g.dim(entry[0], axis),
                                                                                                dims.dims[axis]) \
            or isinstance(entry, int) and entry == dims.dims[axis]

    flat = shape_entries(m.tensor("key_flat_shape"), g)
    unflat = shape_entries(m.tensor("key_unflat_shape"), g)
    if flat is None or unflat is None or len(flat) != 3 or len(unflat) != 4:
        return False
    return (flat[0] == -1 and is_dim(flat[1], 2) and flat[2] == d and is_dim(unflat[0], 0) and is_dim(unflat[1], 1)
            and unflat[2] == d and is_dim(unflat[3], 2) and not any(n.attrs.get("allowzero", 0) and 0 in
                                                                  [e for e in entries if isinstance(e, int)]
                                                                  for n, entries in ((m.node("key_flatten"), flat),
                                                                                     (m.node("key_unflatten"), unflat))))
