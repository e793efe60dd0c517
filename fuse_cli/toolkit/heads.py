"""Attention head splits: a Reshape of [B, S, H*d] into [B, S, H, d], proved from a constant shape
or from the inferred shapes when the exporter computes the shape at run time (torch's dynamo)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.match import Match, constant_value
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.shapes import same_dim, shape_entries


def head_split(reshape: gs.Node, g: GraphEditor) -> tuple[int, int] | None:
    """(H, d) when `reshape` takes a [B, S, H*d] tensor to [B, S, H, d] (split_heads_or_reason)."""
    split = split_heads_or_reason(reshape, g)
    return None if isinstance(split, str) else split


def split_heads_or_reason(reshape: gs.Node, g: GraphEditor, source: gs.Tensor | None = None) -> tuple[int, int] | str:
    """(H, d) when `reshape` takes `source` (its input, or the tensor a bias Add between them keeps
    the shape of), a [B, S, H*d] tensor, to [B, S, H, d]; else why not, in words. Its shape is a
    constant [0, 0|-1, H, d], or [0|-1, S, H, d] with S the input's static length (dynamo writes it
    out: -1 is then exactly the batch), allowzero unset where it holds a 0; or, where the shape is
    computed at run time, its inferred output is [B, S, H, d] with B and S provably the input's (a
    Reshape is row-major, so its output dims make it the split into heads)."""
    source = reshape.inputs[0] if source is None else source
    shape, out = g.shape(source), g.shape(reshape.outputs[0])
    dims = constant_value(reshape.inputs[1])
    if dims is None:
        if (shape is not None and out is not None and shape.rank == 3 and out.rank == 4 and out.static(2)
                and out.static(3) and out.static(2) * out.static(3) == shape.static(2)
                and same_dim(out.dims[0], shape.dims[0]) and same_dim(out.dims[1], shape.dims[1])):
            return out.static(2), out.static(3)
        return (f"the head count is not derivable: {reshape.name}'s shape is computed at run time (a constant "
                f"[0, -1, heads, head_size], or an inferred [batch, sequence, heads, head_size] output, is needed)")
    dims = [int(v) for v in dims.reshape(-1)]
    if (len(dims) != 4 or dims[0] not in (0, -1) or dims[0] == -1 and dims[1] <= 0 or dims[1] < -1
            or min(dims[2:]) <= 0 or reshape.attrs.get("allowzero", 0) and 0 in dims):
        return f"{reshape.name} reshapes to {dims}, not [0, -1 or 0, heads, head_size]"
    if shape is None or shape.rank != 3 or shape.static(2) != dims[2] * dims[3]:
        return (f"{reshape.name} splits {source.name!r} of shape {shape and list(shape.dims)} into {dims[2]} heads "
                f"of {dims[3]}: it must be [batch, sequence, {dims[2] * dims[3]}]")
    if dims[1] > 0 and shape.static(1) != dims[1]:
        return (f"{reshape.name} reshapes to {dims}: sequence length {dims[1]} is not {source.name!r}'s static dim 1 "
                f"({shape.dims[1]}), so it is not [0, -1, heads, head_size]")
    return dims[2], dims[3]


def softmax_key_axis_decline(softmax: gs.Node, opset: int) -> Decline | None:
    """Scores [B, H, S, T] must be normalized over the key axis: Softmax's axis -1 or 3 (its
    default is 1 before opset 13, where Softmax flattened the trailing axes)."""
    axis = softmax.attrs.get("axis", -1 if opset >= 13 else 1)
    return None if axis in (-1, 3) else Decline(f"{softmax.name} normalizes axis {axis}, not the key axis 3")


def flattened_key_t(m: Match, g: GraphEditor, d: int) -> bool:
    """Reshape(K [B, H, S, d], [-1, S, d]), Transpose [0, 2, 1], Reshape([B or -1, H, d, S]) is K^T
    (torch dynamo's sdpa): the shape vectors read K's own dims (or give them statically), or, where
    they are computed otherwise, the inferred shapes are [*, S, d] and [B, H, d, S] (row-major
    reshapes of B*H*S*d values). The match names key_flatten, key_unflatten, key_flat_shape and
    key_unflat_shape."""
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
    if flat is None or unflat is None:  # the inferred shapes decide only what the vectors cannot
        return _flattened_by_inferred_shapes(m, g, dims.dims)
    return (len(flat) == 3 and len(unflat) == 4 and flat[0] == -1 and is_dim(flat[1], 2) and flat[2] == d
            and (unflat[0] == -1 or is_dim(unflat[0], 0)) and is_dim(unflat[1], 1) and unflat[2] == d
            and is_dim(unflat[3], 2)
            and not any(n.attrs.get("allowzero", 0) and 0 in [e for e in entries if isinstance(e, int)]
                        for n, entries in ((m.node("key_flatten"), flat), (m.node("key_unflatten"), unflat))))


def _flattened_by_inferred_shapes(m: Match, g: GraphEditor, k: tuple) -> bool:
    flat, unflat = (g.shape(m.node(name).outputs[0]) for name in ("key_flatten", "key_unflatten"))
    b, h, t, d = k
    return (flat is not None and unflat is not None and (flat.rank, unflat.rank) == (3, 4) and same_dim(flat.dims[1], t)
            and same_dim(flat.dims[2], d) and all(same_dim(x, y) for x, y in zip(unflat.dims, (b, h, d, t))))
