"""Multi-head self-/cross-attention (BERT, GPT-2, ViT exports) -> com.microsoft MultiHeadAttention."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement, TensorShape
from fuse_cli.match import Alt, Const, Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.attention_proofs import scale_decline, scale_of
from fuse_cli.toolkit.heads import softmax_key_axis_decline
from fuse_cli.toolkit.shapes import same_dim, shape_entries

HEADS_PERM, KEY_PERM, LAST_TWO_PERM = [0, 2, 1, 3], [0, 2, 3, 1], [0, 1, 3, 2]
FILL_LIMIT = -1e30  # s + fill rounds to fill in float32 for every |s| < 3e22


def projected(role: str) -> Alt:
    """The [B, L, hidden] tensor a Reshape splits into heads: a bias Add MultiHeadAttention absorbs
    (largest form first), or any tensor."""
    return Alt(Op("Add", Var(f"{role}_in"), Const(lambda v: v.ndim == 1, name=f"{role}_bias"), name=f"{role}_bias_add"),
               Var(f"{role}_in"))


def split_heads(role: str) -> Op:
    return Op("Reshape", projected(role), Var(f"{role}_shape"), name=f"{role}_reshape")


def scaled(x, role: str) -> Alt:
    return Alt(Op(("Mul", "Div"), x, Var(f"{role}_scale", const=True), name=f"{role}_scaling"), x)


QUERY = scaled(Op("Transpose", split_heads("query"), name="query_transpose", perm=HEADS_PERM), "query")
# torch's dynamo exporter transposes K through a batch-flattened 3-D view: Reshape [-1, S, d],
# Transpose [0, 2, 1], Reshape [-1, H, d, S] (check() proves the shapes make it K^T)
KEY_FLATTENED_T = Op("Reshape", Op("Transpose", Op("Reshape", Op("Transpose", split_heads("key"), name="key_heads",
                                                                 perm=HEADS_PERM),
                                                   Var("key_flat_shape"), name="key_flatten"),
                                   name="key_transpose", perm=[0, 2, 1]),
                     Var("key_unflat_shape"), name="key_unflatten")
# K^T as one or two 4-D Transposes; matches() composes their perms (with FusedMatMul's transB)
KEY_4D = Alt(Op("Transpose", split_heads("key"), name="key_transpose"),
             Op("Transpose", Op("Transpose", split_heads("key"), name="key_heads"), name="key_transpose"))
# fused-matmul may have run first (an earlier round, while the head shapes were still computed at
# run time) and folded the score scale -- and K's last-two-axes swap, as transB -- into FusedMatMul
NOT_SET = lambda value: not value  # noqa: E731
SCORES = scaled(Alt(Op("MatMul", QUERY, scaled(Alt(*KEY_4D.options, KEY_FLATTENED_T), "key"), name="qk"),
                    Op("FusedMatMul", QUERY, scaled(KEY_4D, "key"), domain="com.microsoft", name="qk",
                       transA=NOT_SET, transBatchA=NOT_SET, transBatchB=NOT_SET)), "score")
CAUSAL = Alt(Op("Where", Var("keep"), SCORES, Var("fill", const=True), name="causal"),
             Op("Where", Var("drop"), Var("fill", const=True), SCORES, name="causal"), SCORES)
MASKED = Alt(Op("Add", CAUSAL, Var("mask"), name="mask_add"), CAUSAL)
SOFTMAX = Op("Softmax", MASKED, name="softmax")
# dynamo's scaled_dot_product_attention zeroes NaN probabilities: Where(IsNaN(p), 0, p). A softmax of
# finite scores has no NaN (a fully masked row of finite -3.4e38 fills is uniform), so there the
# guard is the identity; check() requires the IsNaN to read this very softmax.
PROBS = Alt(Op("Where", Op("IsNaN", Var("guarded"), name="nan_test"), Const(lambda v: v.size == 1 and v.item() == 0),
               SOFTMAX, name="nan_guard"), SOFTMAX)
CONTEXT = Op("MatMul", PROBS, Op("Transpose", split_heads("value"), name="value_transpose", perm=HEADS_PERM),
             name="context")


@register
class FuseMultiHeadAttention(PatternPass):
    """y = merge_heads(softmax(split(Q) split(K)^T * scale + bias) split(V)), per head

      x ─ MatMul(Wq) ─ Add(bq) ─ Reshape[0,-1,H,d] ─ Transpose[0,2,1,3] ─ (*c) ─┐
     kv ─ MatMul(Wk) ─ Add(bk) ─ Reshape[0,-1,H,d] ─ Transpose[0,2,3,1] ─ (*c) ─ MatMul ─ (/c or *c)
       ─ (Where(causal, s, fill)) ─ (Add(mask)) ─ Softmax(-1) ─ MatMul ─ Transpose ─ Reshape[0,0,H*d]
     kv ─ MatMul(Wv) ─ Add(bv) ─ Reshape[0,-1,H,d] ─ Transpose[0,2,1,3] ──────────┘
       =>  MultiHeadAttention(x·Wq, kv·Wk, kv·Wv, bias=[bq,bk,bv], attention_bias; num_heads=H, scale)

    MultiHeadAttention, not the packed Attention: it takes key/value from another input
    (cross-attention), needs no concatenated copy of the weights, and accepts projections that
    are not constant MatMuls (GPT-2's Split of one packed projection); onnxruntime's CPU runs both.
    The Q/K/V MatMuls stay; a constant [hidden] bias Add on each is absorbed. K^T is one Transpose
    [0,2,3,1] or [0,2,1,3] then [0,1,3,2]. scale is the product of the constant scalar Mul/Div on
    Q, K^T and the scores (emitted when it is not 1/sqrt(d)), times alpha when fused-matmul already
    made Q.K^T a FusedMatMul (transB counts as K's last-two-axes swap). attention_bias (rank 4: B
    or 1, H or 1, S, T) is what the graph adds to the scores: its own mask, plus Where(causal, 0, fill) for a
    causal Where -- equal to the Where when fill <= -1e30, as s + fill then rounds to fill -- and
    an Expand to [1, 1, S, T] unless its last dims are statically S and T (broadcasting them is
    not allowed). Heads and head size come from constant Reshape shapes matching [B, L, H*d]; L
    is 0, -1 or, for a static sequence (ViT's 197 tokens, written out by static-reshape-shape),
    the tensor's static length itself.

    torch.onnx.export(dynamo=True) writes scaled_dot_product_attention with a static length as
    [-1, S, H, d] splits, K^T through a batch-flattened view (Reshape [-1, S, d], Transpose
    [0, 2, 1], Reshape [-1, H, d, S]) and Where(IsNaN(p), 0, p) after the softmax: matched too
    (vit-base dynamo: 12 MultiHeadAttention, 0.96x CPU time, 0.73x peak). Exact for finite
    inputs; where the inputs hold NaN or inf the guard's zeros become the kernel's NaN. With the
    length computed at run time (BERT's dynamo export: bert-base 540 -> 214 nodes) the split and
    merge Reshapes are judged by their inferred output shapes, and K^T's flattening by the Shape
    dims its shape vectors read.
    """

    name = "attention"
    description = "Fuse multi-head attention (Reshape/Transpose/MatMul/Softmax) into MultiHeadAttention"
    label = "multi-head attention -> MultiHeadAttention"
    emits = ("com.microsoft::MultiHeadAttention",)
    min_opset = 8  # Expand shapes the attention_bias (a Where is emitted only where the graph has one)
    pattern = Op("Reshape", Op("Transpose", CONTEXT, name="merge_transpose", perm=HEADS_PERM), Var("merge_shape"),
                 name="merge")

    def matches(self, m: Match, g: GraphEditor) -> bool:
        """Other transposes are other computations, not near-misses (the pattern fixes Q's, V's and
        the merge's perms; the 3-D route's [0, 2, 1] on [B*H, S, d] is K^T once check() proves the shapes)."""
        if "nan_guard" in m.nodes and m.tensor("guarded") is not m.node("softmax").outputs[0]:
            return False
        return "key_flatten" in m.nodes or _key_axes(m) == KEY_PERM

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, None]:
        return g.dtype(m.tensor("query_in")), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        if decline := softmax_key_axis_decline(m.node("softmax"), g.opset):
            return decline
        heads = {role: _heads(m, g, role) for role in ("query", "key", "value")}
        for value in heads.values():
            if isinstance(value, Decline):
                return value
        (h, d), (hk, dk), (hv, dv) = heads.values()
        if (h, d) != (hk, dk) or hv != h:
            return Decline(f"the heads differ: query {h}x{d}, key {hk}x{dk}, value {hv}x{dv}")
        q_shape, k_shape, v_shape = (g.shape(m.tensor(f"{r}_in")) for r in ("query", "key", "value"))
        if "key_flatten" in m.nodes:
            reason = _flattened_key_reason(m, g, k_shape, h, d)
            if reason:
                return reason
        if not same_dim(q_shape.dims[0], k_shape.dims[0]) or not same_dim(k_shape.dims[0], v_shape.dims[0]):
            return Decline("the query, key and value batch sizes are not provably equal (MatMul would broadcast them)")
        merged = constant_value(m.tensor("merge_shape"))
        merged = None if merged is None else [int(s) for s in merged.reshape(-1)]
        inferred = merged is None and _merge_by_inferred_shape(g, m.node("merge_transpose").outputs[0],
                                                               m.node("merge").outputs[0], hv * dv)
        lengths = (0, -1, q_shape.static(1))  # a static query length written out (ViT's 197) is exact too
        # [-1, S, H*d] with S written out (dynamo) leaves -1 exactly the batch; allowzero matters only with a 0
        first = (0, -1) if merged is not None and len(merged) == 3 and merged[1] == q_shape.static(1) else (0,)
        if not inferred and (merged is None or len(merged) != 3 or merged[0] not in first or merged[1] not in lengths
                             or merged[2] != hv * dv or m.node("merge").attrs.get("allowzero", 0) and 0 in merged):
            return Decline(f"{m.node('merge').name} reshapes to {merged}, not [0, 0, {hv * dv}] (merging the heads)")
        if decline := scale_decline(m):
            return decline
        alpha = m.node("qk").attrs.get("alpha", 1.0)
        if not (np.isfinite(alpha) and alpha != 0):
            return Decline(f"{m.node('qk').name} scales by alpha {alpha}, not a finite nonzero scalar")
        fill = constant_value(m.tensor("fill")) if "causal" in m.nodes else None
        if fill is not None and (fill.size != 1 or not float(fill.reshape(-1)[0]) <= FILL_LIMIT):
            return (Decline(f"{m.node('causal').name} fills masked scores with {fill.reshape(-1)[:4].tolist()}: attention_bias "
                    f"adds, which equals the Where only for a scalar fill <= {FILL_LIMIT:g}"))
        for term in ("keep", "drop", "mask"):
            if m.tensor(term) is not None:
                reason = _bias_reason(g, m.tensor(term), h, q_shape)
                if reason:
                    return Decline(f"the {'causal ' if term != 'mask' else ''}mask {m.tensor(term).name!r} {reason}")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        h, d = _heads(m, g, "query")
        scale = scale_of(m)  # float64 product, rounded once into the attribute
        attrs = {"num_heads": h}
        if not np.isclose(scale, d**-0.5, rtol=1e-6, atol=0):
            attrs["scale"] = scale
        qkv = [m.tensor(f"{r}_in") for r in ("query", "key", "value")]
        nodes, bias = [], gs.Variable.empty()
        if any(m.tensor(f"{r}_bias") is not None for r in ("query", "key", "value")):
            parts = [constant_value(m.tensor(f"{r}_bias")) if m.tensor(f"{r}_bias") is not None
                     else np.zeros(g.shape(t).dims[-1], g.dtype(t)) for r, t in zip(("query", "key", "value"), qkv)]
            bias = g.constant(f"{m.node('merge').name}_qkv_bias", np.concatenate(parts).astype(g.dtype(qkv[0])))
        attention_bias = _attention_bias(m, g, qkv, nodes)
        inputs = [*qkv, bias, gs.Variable.empty(), attention_bias]
        while isinstance(inputs[-1], gs.Variable) and inputs[-1].name == "":
            inputs.pop()
        nodes.append(gs.Node(op="MultiHeadAttention", domain="com.microsoft", attrs=attrs, inputs=inputs,
                             name=g.unique_name(f"{m.node('softmax').name}_mha"), outputs=[m.root.outputs[0]]))
        return Replacement(nodes=nodes)


def _key_axes(m: Match) -> list[int]:
    """K's axes after its Transposes and FusedMatMul's transB, composed: [0, 2, 3, 1] is K^T."""
    key = list(range(4))
    for name in ("key_heads", "key_transpose"):
        if name in m.nodes:
            perm = list(m.node(name).attrs.get("perm", []))
            key = [key[axis] for axis in perm] if len(perm) == 4 else []
    if m.node("qk").attrs.get("transB", 0) and key:
        key = [key[axis] for axis in LAST_TWO_PERM]
    return key


def _heads(m: Match, g: GraphEditor, role: str) -> tuple[int, int] | Decline:
    """(heads, head size) a constant Reshape shape [0, -1 or 0, H, d] gives a [B, L, H*d] input."""
    reshape, source = m.node(f"{role}_reshape"), m.tensor(f"{role}_in")
    shape = constant_value(m.tensor(f"{role}_shape"))
    if shape is None:
        split = _split_by_inferred_shape(g, source, reshape.outputs[0])
        if split is None:
            return (Decline(f"the head count is not derivable: {reshape.name}'s shape is computed at run time "
                    f"(a constant [0, -1, heads, head_size], or an inferred [batch, sequence, heads, head_size] "
                    f"output, is needed)"))
        return _bias_size_reason(m, g, role, source, *split) or split
    dims, source_shape = [int(s) for s in shape.reshape(-1)], g.shape(source)
    # [-1, S, H, d] (dynamo) is exact when S is the static length checked below: -1 is then the batch
    if (len(dims) != 4 or dims[0] not in (0, -1) or dims[0] == -1 and dims[1] <= 0 or dims[1] < -1
            or min(dims[2:]) <= 0 or reshape.attrs.get("allowzero", 0) and 0 in dims):
        return Decline(f"{reshape.name} reshapes to {dims}, not [0, -1 or 0, heads, head_size]")
    if source_shape is None or source_shape.rank != 3 or source_shape.static(2) != dims[2] * dims[3]:
        return (Decline(f"{reshape.name} splits {source.name!r} of shape {source_shape and list(source_shape.dims)} into "
                f"{dims[2]} heads of {dims[3]}: it must be [batch, sequence, {dims[2] * dims[3]}]"))
    if dims[1] > 0 and source_shape.static(1) != dims[1]:  # a written-out length must be the static one
        return (Decline(f"{reshape.name} reshapes to {dims}: sequence length {dims[1]} is not {source.name!r}'s "
                f"static dim 1 ({source_shape.dims[1]}), so it is not [0, -1, heads, head_size]"))
    return _bias_size_reason(m, g, role, source, dims[2], dims[3]) or (dims[2], dims[3])


def _bias_size_reason(m: Match, g: GraphEditor, role: str, source: gs.Tensor, heads: int, size: int) -> Decline | None:
    bias = m.tensor(f"{role}_bias")
    if bias is not None and (constant_value(bias).size != heads * size or g.dtype(bias) != g.dtype(source)):
        return (Decline(f"{m.node(f'{role}_bias_add').name}'s bias {bias.name!r} is not a [{heads * size}] vector "
                "of the input's type"))
    return None


def _merge_by_inferred_shape(g: GraphEditor, heads: gs.Tensor, merged: gs.Tensor, hidden: int) -> bool:
    """[B, S, H, d] -> [B, S, H*d] by the inferred shapes (a shape computed at run time)."""
    src, out = g.shape(heads), g.shape(merged)
    return (src is not None and out is not None and src.rank == 4 and out.rank == 3 and out.static(2) == hidden
            and same_dim(src.dims[0], out.dims[0]) and same_dim(src.dims[1], out.dims[1]))


def _split_by_inferred_shape(g: GraphEditor, source: gs.Tensor, split: gs.Tensor) -> tuple[int, int] | None:
    """(H, d) when shape inference gives Reshape's output as [B, S, H, d] for a [B, S, H*d] input
    (the same B and S, provably): the shape tensor was computed at run time (torch's dynamo export
    with a symbolic sequence), but a Reshape is a row-major reinterpretation fixed by its output's
    dims, so those make it the head split. fuse optimize verifies every rewrite besides."""
    src, out = g.shape(source), g.shape(split)
    if src is None or out is None or src.rank != 3 or out.rank != 4:
        return None
    h, d = out.static(2), out.static(3)
    if h is None or d is None or src.static(2) != h * d or not (same_dim(src.dims[0], out.dims[0])
                                                                 and same_dim(src.dims[1], out.dims[1])):
        return None
    return h, d


def _flattened_by_inferred_shapes(m: Match, g: GraphEditor) -> bool:
    """K^T by the inferred shapes: [B, H, T, d] -> [*, T, d] -> transposed -> [B, H, d, T]."""
    k4, flat, unflat = (g.shape(m.node(n).outputs[0]) for n in ("key_heads", "key_flatten", "key_unflatten"))
    if k4 is None or flat is None or unflat is None or (k4.rank, flat.rank, unflat.rank) != (4, 3, 4):
        return False
    b, h, t, d = k4.dims
    return (same_dim(flat.dims[1], t) and same_dim(flat.dims[2], d)
            and all(same_dim(x, y) for x, y in zip(unflat.dims, (b, h, d, t))))


def _flattened_by_read_dims(m: Match, g: GraphEditor) -> bool:
    """K^T by the shape vectors themselves, when they are built from Shape(K) (a symbolic length):
    [-1, dim 2, d] and then [dim 0 or -1, dim 1 or H, d, dim 2] of the [B, H, T, d] heads."""
    k4 = g.shape(m.node("key_heads").outputs[0])
    if k4 is None or k4.rank != 4:
        return False

    def dims(name: str) -> list | None:
        entries = shape_entries(m.tensor(name), g)
        if entries is None or any(e is None for e in entries):
            return None
        return [e if isinstance(e, int) else g.dim(*e) for e in entries]

    b, h, t, d = k4.dims
    flat, unflat = dims("key_flat_shape"), dims("key_unflat_shape")
    return (flat is not None and unflat is not None and len(flat) == 3 and len(unflat) == 4
            and flat[0] == -1 and same_dim(flat[1], t) and same_dim(flat[2], d)
            and (unflat[0] == -1 or same_dim(unflat[0], b)) and same_dim(unflat[1], h)
            and same_dim(unflat[2], d) and same_dim(unflat[3], t))


def _flattened_key_reason(m: Match, g: GraphEditor, k_shape: TensorShape, heads: int, size: int) -> Decline | None:
    """The 3-D route is K^T only as Reshape [-1, T, d] of [B, H, T, d], then [-1, H, d, T]."""
    length = k_shape.static(1)
    flat, unflat = (constant_value(m.tensor(name)) for name in ("key_flat_shape", "key_unflat_shape"))
    if (flat is None or unflat is None) and (_flattened_by_inferred_shapes(m, g) or _flattened_by_read_dims(m, g)):
        return None
    flat = None if flat is None else [int(v) for v in flat.reshape(-1)]
    unflat = None if unflat is None else [int(v) for v in unflat.reshape(-1)]
    if length is None or flat != [-1, length, size] or unflat != [-1, heads, size, length]:
        return (Decline(f"{m.node('key_flatten').name} and {m.node('key_unflatten').name} reshape to {flat} and {unflat}, "
                f"not [-1, {length}, {size}] and [-1, {heads}, {size}, {length}] (K transposed per head)"))
    return None


def _bias_reason(g: GraphEditor, t: gs.Tensor, heads: int, q: TensorShape) -> Decline | None:
    """attention_bias is [B or 1, H or 1, S, T]; dims 2 and 3 can be Expanded from 1, dims 0 and 1 cannot."""
    shape = g.shape(t)
    if shape is None or shape.rank != 4:
        return Decline(f"has shape {shape and list(shape.dims)}; attention_bias needs rank 4 [batch or 1, heads or 1, S, T]")
    d0, d1 = _dim(g, t, 0), _dim(g, t, 1)
    if not (d0 == 1 or same_dim(d0, q.dims[0])) or d1 not in (1, heads):
        return Decline(f"has shape {[d0, d1, *shape.dims[2:]]}: its first dims are not provably batch or 1, then {heads} or 1")
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


def _attention_bias(m: Match, g: GraphEditor, qkv: list[gs.Tensor], nodes: list[gs.Node]) -> gs.Tensor:
    """What the scores get added: the causal Where as 0/fill, plus the additive mask, in [.., S, T]."""
    terms = [m.tensor("mask")] if m.tensor("mask") is not None else []
    if "causal" in m.nodes:
        dtype = g.dtype(qkv[0])
        zero = g.constant("causal_zero", np.zeros((), dtype))
        fill = g.constant("causal_fill", constant_value(m.tensor("fill")).astype(dtype))
        keep = m.tensor("keep") is not None
        inputs = [m.tensor("keep"), zero, fill] if keep else [m.tensor("drop"), fill, zero]
        terms.insert(0, _node(g, nodes, "Where", inputs, m.node("causal").name))
    if not terms:
        return gs.Variable.empty()
    bias = terms[0] if len(terms) == 1 else _node(g, nodes, "Add", terms, m.node("mask_add").name)
    given = [g.shape(m.tensor(name)).dims for name in ("keep", "drop", "mask") if m.tensor(name) is not None]
    q, k = (g.shape(t).dims[1] for t in qkv[:2])
    if any(same_dim(dims[2], q) for dims in given) and any(same_dim(dims[3], k) for dims in given):
        return bias
    lengths = [_node(g, nodes, "Gather", [_node(g, nodes, "Shape", [_length_source(g, t)], "attention"),
                                          g.constant("dim1", np.array([1], np.int64))], "attention") for t in qkv[:2]]
    shape = _node(g, nodes, "Concat", [g.constant("ones", np.ones(2, np.int64)), *lengths], "attention", axis=0)
    return _node(g, nodes, "Expand", [bias, shape], "attention_bias")


def _length_source(g: GraphEditor, t: gs.Tensor) -> gs.Tensor:
    """A tensor with t's dim 1: the [B, L, in] input of the MatMul by a [in, out] weight that
    projects t, where there is one. Read from the input, the lengths leave the projections to the
    attention alone, so packed-attention can merge them."""
    producer = t.inputs[0] if len(t.inputs) == 1 else None
    if producer is None or producer.op != "MatMul":
        return t
    source, weight = (g.shape(i) for i in producer.inputs)
    return producer.inputs[0] if source is not None and source.rank == 3 and weight is not None and weight.rank == 2 else t


def _node(g: GraphEditor, nodes: list[gs.Node], op: str, inputs: list[gs.Tensor], base: str, **attrs) -> gs.Variable:
    out = g.variable(f"{base}_{op.lower()}_out")
    nodes.append(gs.Node(op=op, name=g.unique_name(f"{base}_{op.lower()}"), attrs=attrs, inputs=inputs, outputs=[out]))
    return out


