"""Self-attention subgraphs in the forms torch.onnx.export writes them (opset 14 and 17).

One builder, `attention_model`, with keyword switches for the variants the exporters produce
(BERT with an additive padding mask, GPT-2 with the causal Where, ViT with the scale on Q) and
for the near-misses the tests need. Linear layers are MatMul + Add(bias, product), bias first, as
torch emits them; scalars are 0-d initializers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from tests.graphs import GraphBuilder

# Symbolic dims at two distinct sizes each; the mask input is a 0/1 attention_mask, as tokenizers give it.
SIZES = ({"batch": 1, "sequence": 3, "memory_sequence": 5}, {"batch": 3, "sequence": 8, "memory_sequence": 2})
MASK_VALUES = {"attention_mask": (0, 2)}


def assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    """The rewrite against the original in onnxruntime, at both SIZES and two seeds."""
    from fuse_cli.verify import verify_models

    for dims in SIZES:
        for seed in (0, 1):
            result = verify_models(original, fused, dims=dims, seed=seed, rtol=1e-4, atol=1e-5, int_ranges=MASK_VALUES)
            assert result.passed, result.outputs

F32_MIN = float(np.finfo(np.float32).min)


def attention_model(*, opset: int = 17, heads: int = 4, head_size: int = 16, seq: str | int = "sequence",
                    mask: str | None = None, causal_fill: float | None = None, masked_fill: bool = False,
                    scale: str = "div", k_transpose: str = "fused", cross: bool = False, packed: bool = False,
                    split_shape: str = "const", softmax_axis: int = -1, probs_output: bool = False,
                    static_length: int | None = None, fused_scores: bool = False, dtype=np.float32) -> onnx.ModelProto:
    """mask: None, "padding" ([B,1,1,T] from an int64 attention_mask: (1 - m) * -10000) or "rank3"
    ([B,1,T], which no attention_bias layout takes). causal_fill: GPT-2's torch.where(tril, s, fill),
    the tril sliced from a constant buffer (masked_fill: Where(not tril, fill, s)). scale: "div"
    (s / sqrt(d)), "mul" (s * 1/sqrt(d)), "query" (q * 1/sqrt(d) before Q.K^T, as timm's ViT),
    "both" (q and k^T each times d^-1/4, the SDPA export), "custom" (s / 5) or "computed"
    (s / sqrt(hidden / heads) from the input's shape at run time). k_transpose: "fused" (one
    Transpose [0,2,3,1]) or "pair" ([0,2,1,3] then [0,1,3,2]). packed: one Q/K/V projection Split
    in three (GPT-2's c_attn). cross: key and value from a second input. split_shape "concat": the
    head-split shape computed from Shape at run time (torch with dynamic axes). static_length: the
    split and merge shapes write the sequence length out ([0, 197, H, d] and [0, 197, H*d], what
    static-reshape-shape makes of ViT's run-time shapes). fused_scores: Q.K^T as the FusedMatMul
    fused-matmul makes of it (scale as alpha, the "pair" form's last-two-axes swap as transB)."""
    b = GraphBuilder(opset=opset, seed=7, extra_opsets={"com.microsoft": 1} if fused_scores else None)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    hidden = heads * head_size
    x = b.input("hidden", ["batch", seq, hidden], elem)
    kv = b.input("memory", ["batch", "memory_sequence", hidden], elem) if cross else x

    def const(value) -> str:
        return b.const(np.asarray(value, dtype=dtype))

    def linear(t: str, name: str) -> str:
        product = b.op("MatMul", t, const(b.rand(hidden, hidden) * hidden**-0.5), name=f"{name}_matmul")
        return b.op("Add", const(b.rand(hidden) * 0.1), product, name=f"{name}_add")

    length = -1 if static_length is None else static_length
    if split_shape == "const":
        split = b.const(np.array([0, length, heads, head_size], np.int64), name="split_heads_shape")
    else:  # torch with dynamic axes: x.size()[:-1] + (heads, head_size), computed at run time
        batch_seq = b.op("Slice", b.op("Shape", x), b.const(np.array([0], np.int64)), b.const(np.array([2], np.int64)))
        split = b.op("Concat", batch_seq, b.const(np.array([heads, head_size], np.int64)), axis=0)

    def heads_of(t: str, name: str, perm: list[int]) -> str:
        return b.op("Transpose", b.op("Reshape", t, split, name=f"{name}_reshape"), perm=perm, name=f"{name}_transpose")

    if packed:  # GPT-2's c_attn: one projection to 3 * hidden, then split(hidden, dim=2)
        qkv = b.op("MatMul", x, const(b.rand(hidden, 3 * hidden) * hidden**-0.5), name="qkv_matmul")
        qkv = b.op("Add", const(b.rand(3 * hidden) * 0.1), qkv, name="qkv_add")
        projections = b.op("Split", qkv, b.const(np.array([hidden] * 3, np.int64)), axis=2, outputs=3)
    else:
        projections = [linear(x, "query"), linear(kv, "key"), linear(kv, "value")]
    q = heads_of(projections[0], "query", [0, 2, 1, 3])
    if k_transpose == "fused":
        k = heads_of(projections[1], "key", [0, 2, 3, 1])
    elif fused_scores:  # the [0,1,3,2] Transpose became FusedMatMul's transB
        k = heads_of(projections[1], "key", [0, 2, 1, 3])
    else:
        k = b.op("Transpose", heads_of(projections[1], "key", [0, 2, 1, 3]), perm=[0, 1, 3, 2])
    v = heads_of(projections[2], "value", [0, 2, 1, 3])

    inv_sqrt = head_size**-0.5
    if fused_scores:  # what fused-matmul leaves: alpha = 1/sqrt(d), K's [0,1,3,2] as transB
        swap = k_transpose == "pair"
        scores = b.op("FusedMatMul", q, k, domain="com.microsoft", name="qk_matmul", alpha=inv_sqrt, transA=0,
                      transB=int(swap))
        scale = "fused"
    elif scale == "query":
        q = b.op("Mul", q, const(inv_sqrt))
    elif scale == "both":
        q, k = b.op("Mul", q, const(inv_sqrt**0.5)), b.op("Mul", k, const(inv_sqrt**0.5))
    if not fused_scores:
        scores = b.op("MatMul", q, k, name="qk_matmul")
    if scale == "div":
        scores = b.op("Div", scores, const(np.sqrt(head_size)), name="scale_div")
    elif scale == "mul":
        scores = b.op("Mul", const(inv_sqrt), scores, name="scale_mul")
    elif scale == "custom":
        scores = b.op("Div", scores, const(5.0), name="scale_div")
    elif scale == "computed":  # sqrt(hidden / heads) from the input's shape, at run time
        width = b.op("Cast", b.op("Slice", b.op("Shape", x), b.const(np.array([-1], np.int64)),
                                  b.const(np.array([3], np.int64))), to=elem)
        scores = b.op("Div", scores, b.op("Sqrt", b.op("Div", width, const([heads]))), name="scale_div")

    if causal_fill is not None:
        # GPT-2: bias[:, :, T - S:T, :T] of a lower-triangular bool buffer, sizes from the input
        tril = b.const(np.tril(np.ones((1, 1, 64, 64), bool)), name="causal_buffer")
        length = b.op("Slice", b.op("Shape", x), b.const(np.array([1], np.int64)), b.const(np.array([2], np.int64)))
        zero = b.const(np.array([0, 0], np.int64))
        ends = b.op("Concat", length, length, axis=0)
        cond = b.op("Slice", tril, zero, ends, b.const(np.array([2, 3], np.int64)), name="causal_slice")
        if masked_fill:  # scores.masked_fill(~causal, fill)
            scores = b.op("Where", b.op("Not", cond), const(causal_fill), scores, name="causal_where")
        else:
            scores = b.op("Where", cond, scores, const(causal_fill), name="causal_where")
    if mask is not None:
        m = b.input("attention_mask", ["batch", "memory_sequence" if cross else seq], TensorProto.INT64)
        axes = [1, 2] if mask == "padding" else [1]
        m = b.op("Unsqueeze", m, b.const(np.array(axes, np.int64)))
        m = b.op("Sub", const(1.0), b.op("Cast", m, to=elem))
        m = b.op("Mul", m, const(-10000.0), name="mask_mul")
        scores = b.op("Add", scores, m, name="mask_add")

    probs = b.op("Softmax", scores, axis=softmax_axis, name="softmax")
    context = b.op("MatMul", probs, v, name="context_matmul")
    context = b.op("Transpose", context, perm=[0, 2, 1, 3], name="merge_transpose")
    context = b.op("Reshape", context, b.const(np.array([0, static_length or 0, hidden], np.int64)),
                    name="merge_reshape")
    out = b.op("MatMul", context, const(b.rand(hidden, hidden) * hidden**-0.5), name="output_matmul")
    outputs = (out, probs) if probs_output else (out,)
    names = ("output", "probs") if probs_output else ("output",)
    model = b.build(*outputs, output_names=names)
    for output in model.graph.output:  # onnx's inference stops at com.microsoft operators
        output.type.tensor_type.elem_type = output.type.tensor_type.elem_type or elem
    return model


def bert(opset: int, padding: bool) -> onnx.ModelProto:
    return attention_model(opset=opset, mask="padding" if padding else None,
                           softmax_axis=3 if opset == 14 else -1)


def gpt2(opset: int, padding: bool) -> onnx.ModelProto:
    # GPT-2: packed c_attn split in three, s / full([], sqrt(d)), causal fill finfo(float32).min
    return attention_model(opset=opset, mask="padding" if padding else None, causal_fill=F32_MIN,
                           k_transpose="pair", packed=True)


def vit(opset: int) -> onnx.ModelProto:
    # ViT: a fixed number of patch tokens (static sequence), no mask
    return attention_model(opset=opset, seq=17, heads=6, head_size=8, scale="query", k_transpose="pair")


def vit_static(opset: int, fused_scores: bool = False) -> onnx.ModelProto:
    # ViT as torch exports it (scale on the scores, K^T in one Transpose) after static-reshape-shape:
    # the 197 (here 17) tokens written out in the head-split and merge shapes
    return attention_model(opset=opset, seq=17, heads=6, head_size=8, scale="mul", static_length=17,
                           fused_scores=fused_scores)


def dynamo_sdpa_model(*, length: int = 5, heads: int = 2, head_size: int = 4, flat_shape: list[int] | None = None,
                      guard_other: bool = False, symbolic: bool = False) -> onnx.ModelProto:
    """scaled_dot_product_attention as torch.onnx.export(dynamo=True) writes it for a static length
    (ViT): split shape [-1, S, H, d]; the scale d^-1/4 on Q and on K^T; K^T through a batch-flattened
    view (Reshape [-1, S, d], Transpose [0, 2, 1], Reshape [-1, H, d, S]); an additive bias from an
    all-true boolean mask; the probabilities guarded by Where(IsNaN(p), 0, p); merge shape
    [-1, S, H*d] with allowzero=1. flat_shape replaces [-1, S, d] (e.g. [-1, d, S]: the same sizes,
    but a reinterpretation, not K^T); guard_other makes the IsNaN read the scores, not the softmax.
    symbolic: a "sequence" length, every shape computed from Shape at run time as BERT's export has
    it (split [B, S, -1, d], K^T's [-1, T, d] and [B, H, d, T] read from Shape(K))."""
    b = GraphBuilder(opset=18, seed=11)
    hidden = heads * head_size
    x = b.input("hidden", ["batch", "sequence" if symbolic else length, hidden])
    quarter = b.const(np.float32(head_size ** -0.25))

    def ints(*values: int) -> str:
        return b.const(np.array(values, np.int64))

    def dims(t: str, start: int, end: int) -> str:  # Shape(t)[start:end], as the exporter slices it
        return b.op("Slice", b.op("Shape", t), ints(start), ints(end))

    batch, seq = dims(x, 0, 1), dims(x, 1, 2)
    split = (b.op("Concat", batch, seq, ints(-1, head_size), axis=0) if symbolic
             else ints(-1, length, heads, head_size))

    def linear(t: str) -> str:
        return b.op("Add", b.op("MatMul", t, b.const(b.rand(hidden, hidden) * hidden**-0.5)),
                    b.const(b.rand(hidden) * 0.1))

    def heads_of(t: str) -> str:
        return b.op("Transpose", b.op("Reshape", linear(t), split, allowzero=1 if symbolic else 0), perm=[0, 2, 1, 3])

    q = b.op("Mul", heads_of(x), quarter)
    k4 = heads_of(x)
    if symbolic:
        flat_to = b.op("Concat", ints(-1), dims(k4, -2, -1), ints(head_size), axis=0)
        unflat = b.op("Concat", dims(k4, -(2**63), -2), ints(head_size), dims(k4, -2, -1), axis=0)
    else:
        flat_to = ints(*(flat_shape or [-1, length, head_size]))
        unflat = ints(-1, heads, head_size, length)
    flat = b.op("Reshape", k4, flat_to)
    k_t = b.op("Mul", b.op("Reshape", b.op("Transpose", flat, perm=[0, 2, 1]), unflat), quarter)
    keep = b.const(np.ones((1, 1, 1, 1), np.bool_))
    shape = b.op("Concat", batch, ints(1), seq, seq, axis=0)
    bias = b.op("Where", b.op("Expand", keep, shape), b.const(np.float32(0)), b.const(np.float32(F32_MIN)))
    scores = b.op("Add", b.op("MatMul", q, k_t), bias)
    probs = b.op("Softmax", scores, axis=-1)
    guarded = b.op("Where", b.op("IsNaN", scores if guard_other else probs), b.const(np.float32(0)), probs)
    context = b.op("Transpose", b.op("MatMul", guarded, heads_of(x)), perm=[0, 2, 1, 3])
    merge_to = b.op("Concat", batch, seq, ints(hidden), axis=0) if symbolic else ints(-1, length, hidden)
    merged = b.op("Reshape", context, merge_to, allowzero=1)
    return b.build(b.op("MatMul", merged, b.const(b.rand(hidden, hidden))), output_names=["y"])
