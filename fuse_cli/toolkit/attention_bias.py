"""What an attention adds to its scores, as com.microsoft's attention operators take it: one
attention_bias input [B or 1, H or 1, S, T]. The graph's own additive mask, and a causal
Where(keep, s, fill) as the bias Where(keep, 0, fill): its proofs and its build."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, NodeBuilder, TensorShape
from fuse_cli.match import Match, constant_value
from fuse_cli.pipeline.base import Decline
from fuse_cli.toolkit.shapes import same_dim

FILL_LIMIT = -1e30  # s + fill rounds to fill in float32 for every |s| < 3e22
TERMS = ("keep", "drop", "mask")  # the causal Where's condition (either polarity) and the additive mask


def bias_decline(m: Match, g: GraphEditor, heads: int, q: TensorShape) -> Decline | None:
    """The causal Where fills with a scalar <= FILL_LIMIT (s + fill then equals the Where), and each
    term is a rank-4 [B or 1, H or 1, S, T]: dims 2 and 3 may be Expanded from 1, dims 0 and 1 not."""
    fill = constant_value(m.tensor("fill")) if "causal" in m.nodes else None
    if fill is not None and (fill.size != 1 or not float(fill.reshape(-1)[0]) <= FILL_LIMIT):
        return Decline(f"{m.node('causal').name} fills masked scores with {fill.reshape(-1)[:4].tolist()}: "
                       f"attention_bias adds, which equals the Where only for a scalar fill <= {FILL_LIMIT:g}")
    for term in TERMS:
        t = m.tensor(term)
        if t is None:
            continue
        where = f"the {'causal ' if term != 'mask' else ''}mask {t.name!r}"
        shape = g.shape(t)
        if shape is None or shape.rank != 4:
            return Decline(f"{where} has shape {shape and list(shape.dims)}; attention_bias needs rank 4 "
                           f"[batch or 1, heads or 1, S, T]")
        d0, d1 = _dim(g, t, 0), _dim(g, t, 1)
        if not (d0 == 1 or same_dim(d0, q.dims[0])) or d1 not in (1, heads):
            return Decline(f"{where} has shape {[d0, d1, *shape.dims[2:]]}: its first dims are not provably batch "
                           f"or 1, then {heads} or 1")
    return None


def _dim(g: GraphEditor, t: gs.Tensor, axis: int):
    """A dim shape inference left unknown, read through the Slice (of other axes), Cast and Not that
    take a causal mask out of a constant buffer (GPT-2's bias[:, :, T-S:T, :T])."""
    shape, producer = g.shape(t), t.inputs[0] if len(t.inputs) == 1 else None
    if shape is not None and shape.dims[axis] is not None or producer is None:
        return shape.dims[axis] if shape is not None else None
    if producer.op in ("Cast", "Not"):
        return _dim(g, producer.inputs[0], axis)
    axes = constant_value(producer.inputs[3]) if producer.op == "Slice" and len(producer.inputs) > 3 else None
    if axes is not None and axis not in {int(a) % 4 for a in axes.reshape(-1)}:
        return _dim(g, producer.inputs[0], axis)
    return None


def attention_bias(m: Match, g: GraphEditor, b: NodeBuilder, query: gs.Tensor, key: gs.Tensor) -> gs.Tensor:
    """What the scores get added, built with `b`: the causal Where as 0/fill, plus the additive mask,
    Expanded to [1, 1, S, T] unless a term's last dims are already S and T (the kernels broadcast
    the batch and the heads, never those). An empty tensor where nothing is added."""
    terms = [m.tensor("mask")] if m.tensor("mask") is not None else []
    if "causal" in m.nodes:
        dtype = g.dtype(query)
        zero = g.constant("causal_zero", np.zeros((), dtype))
        fill = g.constant("causal_fill", constant_value(m.tensor("fill")).astype(dtype))
        keep = m.tensor("keep") is not None
        where = [m.tensor("keep"), zero, fill] if keep else [m.tensor("drop"), fill, zero]
        terms.insert(0, b.op.Where(*where, _name=f"{m.node('causal').name}_where"))
    if not terms:
        return gs.Variable.empty()
    bias = terms[0] if len(terms) == 1 else b.op.Add(*terms, _name=f"{m.node('mask_add').name}_add")
    given = [g.shape(m.tensor(term)).dims for term in TERMS if m.tensor(term) is not None]
    s, t = g.dim(query, 1), g.dim(key, 1)
    if any(same_dim(dims[2], s) for dims in given) and any(same_dim(dims[3], t) for dims in given):
        return bias
    lengths = [b.op.Gather(b.op.Shape(_length_source(g, x)), g.constant("dim1", np.array([1], np.int64)))
               for x in (query, key)]
    shape = b.op.Concat(g.constant("ones", np.ones(2, np.int64)), *lengths, axis=0)
    return b.op.Expand(bias, shape, _name="attention_bias_expand")


def _length_source(g: GraphEditor, t: gs.Tensor) -> gs.Tensor:
    """A tensor with t's dim 1: the [B, L, in] input of the MatMul by a [in, out] weight that
    projects t, where there is one. Read from the input, the lengths leave the projections to the
    attention alone, so packed-attention can merge them."""
    producer = t.inputs[0] if len(t.inputs) == 1 else None
    if producer is None or producer.op != "MatMul":
        return t
    source, weight = (g.shape(i) for i in producer.inputs)
    projected = source is not None and source.rank == 3 and weight is not None and weight.rank == 2
    return producer.inputs[0] if projected else t
