"""A decoder LLM's self-attention block in the form transformers' TorchScript export writes it
(Llama, Qwen2: rotate-half rotary embedding, grouped K/V heads repeated by repeat_kv, an additive
causal + padding mask), with switches for the variants and near-misses the tests need."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from tests.graphs import GraphBuilder
from tests.norm_graphs import rms_norm


def llama_attention_model(*, heads: int = 4, kv_heads: int = 2, head_size: int = 8, freqs: str = "mul",
                          tables: str = "computed", half_bounds: str = "shape", mask: str = "causal-padding",
                          repeat: str = "expand", scale: str = "mul", seq: str | int = "sequence",
                          rotate_order: str = "neg-upper", dynamo: bool = False,
                          flat_shape: str = "key", cache: str = "none", partial: bool = False,
                          softcap: tuple[float, float] | None = None, head_norm: bool = False,
                          positions: str = "range", dtype: str = "float32", merge: str = "heads") -> onnx.ModelProto:
    """freqs: positions times inv_freq by "mul" ([1, S, 1] * [d/2]) or "matmul" ([1, d/2, 1] @ [1, 1, S],
    transposed). tables: "computed" (Cos/Sin of Concat(f, f)), "uneven" (Concat(f, 2f): halves differ),
    "inputs" (cos/sin graph inputs [1, sequence, d]) or "constant" (a static-length table; seq must be
    an int). half_bounds: the Slice split "shape" (Shape(x)[3] // 2, as torch writes it) or "const";
    "wrong" splits at d/2 - 1. mask: "causal-padding" ([B, 1, S, S] from attention_mask), "none", or
    "causal-2d" (the causal [S, S] alone, not the [B or 1, H or 1, S, S] attention_bias wants), or
    "padding-only" ([B, 1, 1, T] from attention_mask alone) or "per-head" (causal-padding expanded to
    [B, H, S, T]). repeat: "expand" (repeat_kv), "none" (kv_heads must equal heads) or
    "tile" (Expand at axis 1: heads kv0,kv1,kv0,kv1, not repeat_kv's kv0,kv0,kv1,kv1).
    rotate_order "neg-lower" builds Concat(-x1, x2), not rotate_half. dynamo: as torch.onnx.export(dynamo=True)
    writes scaled_dot_product_attention: split and merge shapes computed from Shape (allowzero=1), d^-1/4 on Q
    and on K^T, K^T through a batch-flattened view [-1, S, d] -> Transpose [0, 2, 1] -> [B, H, d, S], and
    Where(IsNaN(p), 0, p) after the softmax. flat_shape "d-first" flattens to [-1, d, S] instead: the same
    sizes when S == d, but a reinterpretation, not K^T. cache: "none" (output y only), "present" (a prefill:
    the K/V heads are also graph outputs) or "past" (a decode step: past_key/past_value inputs [batch, kv_heads,
    past_sequence, d] concatenated before the new K/V into the present outputs, the mask over
    attention_mask [batch, past_sequence + sequence] with the causal offset of the past). partial: as
    transformers' partial-rotary code (Phi-3) writes it with a rotary dim that is the whole head:
    Concat(rotary(x[..., :d]), x[..., d:]), the second piece empty. softcap (a, b): Gemma2's soft cap on
    the scaled scores before the mask, tanh(s / a) * b (a == b is a soft cap). head_norm: Qwen3's RMSNorm of
    each Q and K head over its head_size, between the split's Reshape and its Transpose. positions: the
    rotary angles' positions, "range" (0..S-1 made in the graph, [1, S]), "input" (a position_ids input
    [batch, sequence], as transformers 5.x takes it in a decode step: cos/sin [batch, 1, S, d]), "other-batch"
    (position_ids [rows, sequence], rows a dim of its own) or "mixed" (cos from position_ids, sin from the range).
    dtype "float16": as torch writes a model.half() export: hidden states, weights, past K/V, scale and mask
    in float16 (the mask's fill float16's lowest), the rotary angles still computed in float32 and cos/sin
    Cast to float16 after Cos/Sin, and (TorchScript) the softmax followed by Cast to float32 and back, as
    `softmax(..., dtype=torch.float32).to(query.dtype)` exports; dynamo's SDPA softmaxes in float16; a
    head_norm is torch's half RMSNorm: Cast(float32), the norm, Cast(float16), Mul(gamma16).
    merge: the heads merged back to "heads" [B, S, H*d], or straight into "rows" [-1, H*d], as dynamo's
    GPT-2 writes it for the Gemm after it (y is then [B*S, H*d])."""
    half_float = dtype == "float16"
    elem, np_dtype = (TensorProto.FLOAT16, np.float16) if half_float else (TensorProto.FLOAT, np.float32)
    b = GraphBuilder(opset=17, seed=5)
    hidden, kv_hidden, half = heads * head_size, kv_heads * head_size, head_size // 2
    x = b.input("hidden", ["batch", seq, hidden], elem)

    def scalar(value: float) -> str:
        return b.const(np.array(value, np_dtype))

    def ints(*values: int) -> str:
        return b.const(np.array(values, np.int64))

    def linear(width: int) -> str:
        return b.op("MatMul", x, b.const((b.rand(hidden, width) * hidden**-0.5).astype(np_dtype)))

    length = b.op("Gather", b.op("Shape", x), b.const(np.array(1, np.int64)), axis=0)
    made = b.op("Unsqueeze", b.op("Range", b.const(np.array(0, np.int64)), length, b.const(np.array(1, np.int64))),
                ints(0))  # [1, S]
    given = (b.input("position_ids", ["rows" if positions == "other-batch" else "batch", seq], TensorProto.INT64)
             if positions != "range" else made)  # [batch, S]
    inv_freq = (10000.0 ** (-np.arange(half) / half)).astype(np.float32)

    def angles(ids: str) -> str:  # [1 or batch, S, d/2]
        if freqs == "mul":
            return b.op("Mul", b.op("Cast", b.op("Unsqueeze", ids, ints(2)), to=TensorProto.FLOAT), b.const(inv_freq))
        p = b.op("Cast", b.op("Unsqueeze", ids, ints(1)), to=TensorProto.FLOAT)  # [1 or batch, 1, S]
        return b.op("Transpose", b.op("MatMul", b.const(inv_freq.reshape(1, half, 1)), p), perm=[0, 2, 1])

    f = angles(given)
    if tables in ("computed", "uneven"):
        other = f if tables == "computed" else b.op("Mul", f, b.const(np.float32(2.0)))
        emb = b.op("Concat", f, other, axis=-1)
        cos, sin = b.op("Cos", emb), b.op("Sin", emb)
        if positions == "mixed":
            f_made = angles(made)
            sin = b.op("Sin", b.op("Concat", f_made, f_made, axis=-1))
    elif tables == "inputs":
        cos, sin = b.input("cos", [1, seq, head_size], elem), b.input("sin", [1, seq, head_size], elem)
    else:
        angles = np.arange(seq)[:, None] * inv_freq[None]
        angles = np.concatenate([angles, angles], -1)[None].astype(np.float32)
        cos, sin = b.const(np.cos(angles).astype(np_dtype)), b.const(np.sin(angles).astype(np_dtype))
    if half_float and tables in ("computed", "uneven"):  # the float32 tables rounded once, as torch's .to(x.dtype)
        cos, sin = b.op("Cast", cos, to=elem), b.op("Cast", sin, to=elem)
    cos, sin = b.op("Unsqueeze", cos, ints(1)), b.op("Unsqueeze", sin, ints(1))

    batch_seq = b.op("Slice", b.op("Shape", x), ints(0), ints(2))

    def split(t: str, n: int, normed: bool = False) -> str:
        if dynamo:
            heads = b.op("Reshape", t, b.op("Concat", batch_seq, ints(n, head_size), axis=0), allowzero=1)
        else:
            heads = b.op("Reshape", t, ints(0, 0, n, head_size))
        if normed and half_float:
            (heads,) = rms_norm(b, b.op("Cast", heads, to=TensorProto.FLOAT), gamma_shape=None)
            gamma = b.const(b.rand(head_size, low=0.5, high=1.5).astype(np.float16))
            heads = b.op("Mul", gamma, b.op("Cast", heads, to=elem))
        elif normed:
            (heads,) = rms_norm(b, heads, gamma_shape=(head_size,))
        return b.op("Transpose", heads, perm=[0, 2, 1, 3])

    def rotary(t: str) -> str:
        if half_bounds == "shape":
            mid = b.op("Unsqueeze",
                       b.op("Div", b.op("Gather", b.op("Shape", t), b.const(np.array(3, np.int64)), axis=0),
                                         b.const(np.array(2, np.int64))), ints(0))
        else:
            mid = ints(half - 1 if half_bounds == "wrong" else half)
        lower = b.op("Slice", t, ints(0), mid, ints(3), ints(1))
        upper = b.op("Slice", t, mid, ints(2**63 - 1), ints(3), ints(1))
        first, second = (b.op("Neg", upper), lower) if rotate_order == "neg-upper" else (b.op("Neg", lower), upper)
        rotated = b.op("Concat", first, second, axis=-1)
        return b.op("Add", b.op("Mul", t, cos), b.op("Mul", rotated, sin))

    def repeat_kv(t: str) -> str:
        if repeat == "none":
            return t
        n = heads // kv_heads
        dims = b.op("Shape", t)
        bs, rest = b.op("Slice", dims, ints(0), ints(1)), b.op("Slice", dims, ints(2), ints(4))
        if repeat == "tile":
            unsq = b.op("Unsqueeze", t, ints(1))
            to = b.op("Concat", bs, ints(n, kv_heads), rest, axis=0)
        else:
            unsq = b.op("Unsqueeze", t, ints(2))
            to = b.op("Concat", bs, ints(kv_heads, n), rest, axis=0)
        return b.op("Reshape", b.op("Expand", unsq, to), b.op("Concat", bs, ints(heads), rest, axis=0))

    def rotated(t: str) -> str:
        if not partial:
            return rotary(t)
        rot = b.op("Slice", t, ints(0), ints(head_size), ints(3), ints(1))
        return b.op("Concat", rotary(rot),
                    b.op("Slice", t, ints(head_size), ints(2**63 - 1), ints(3), ints(1)), axis=-1)

    q = rotated(split(linear(hidden), heads, head_norm))
    k, v = rotated(split(linear(kv_hidden), kv_heads, head_norm)), split(linear(kv_hidden), kv_heads)
    if cache == "past":
        past_dims = ["batch", kv_heads, "past_sequence", head_size]
        k, v = (b.op("Concat", b.input(f"past_{role}", past_dims, elem), t, axis=-2)
                for role, t in (("key", k), ("value", v)))
    presents = [k, v] if cache != "none" else []
    k, v = repeat_kv(k), repeat_kv(v)
    if dynamo:
        quarter = scalar(head_size**-0.25)
        k_dims = b.op("Shape", k)
        k_len = b.op("Slice", k_dims, ints(-2), ints(-1))
        flat_to = (b.op("Concat", ints(-1), k_len, ints(head_size), axis=0) if flat_shape == "key"
                   else b.op("Concat", ints(-1, head_size), k_len, axis=0))
        unflat = b.op("Concat", b.op("Slice", k_dims, ints(0), ints(-2)), ints(head_size), k_len, axis=0)
        k_t = b.op("Reshape", b.op("Transpose", b.op("Reshape", k, flat_to), perm=[0, 2, 1]), unflat)
        scores = b.op("MatMul", b.op("Mul", q, quarter), b.op("Mul", k_t, quarter))
    else:
        scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
        scores = (b.op("Mul", scores, scalar(head_size**-0.5)) if scale == "mul"
                  else b.op("Div", scores, scalar(3.0)))
    if softcap is not None:
        divisor, cap = softcap
        scores = b.op("Mul", b.op("Tanh", b.op("Div", scores, scalar(divisor))), scalar(cap))
    if mask != "none":
        m = b.input("attention_mask", ["batch", "past_sequence + sequence" if cache == "past" else seq],
                    TensorProto.INT64)
        rows = b.op("Range", b.const(np.array(0, np.int64)), length, b.const(np.array(1, np.int64)))
        if cache == "past":  # key j is visible to query i when j <= past + i
            total = b.op("Gather", b.op("Shape", m), b.const(np.array(1, np.int64)), axis=0)
            cols = b.op("Range", b.const(np.array(0, np.int64)), total, b.const(np.array(1, np.int64)))
            last = b.op("Add", rows, b.op("Sub", total, length))
            causal = b.op("LessOrEqual", b.op("Unsqueeze", cols, ints(0)), b.op("Unsqueeze", last, ints(1)))  # [S, T]
        else:
            causal = b.op("LessOrEqual", b.op("Unsqueeze", rows, ints(0)), b.op("Unsqueeze", rows, ints(1)))  # [S, S]
        keep = b.op("And", causal, b.op("Unsqueeze", b.op("Cast", m, to=TensorProto.BOOL), ints(1)))  # [B, S, S]
        keep = causal if mask == "causal-2d" else b.op("Unsqueeze", keep, ints(1))
        if mask == "padding-only":  # [B, 1, 1, T]: broadcast over the queries, no causal part
            keep = b.op("Unsqueeze", b.op("Cast", m, to=TensorProto.BOOL), ints(1, 2))
        if mask == "per-head":  # the causal-padding mask expanded to [B, H, S, T]
            keep = b.op("Expand", keep, ints(1, heads, 1, 1))
        scores = b.op("Add", scores, b.op("Where", keep, scalar(0), scalar(np.finfo(np_dtype).min)))
    probs = b.op("Softmax", scores, axis=-1)
    if half_float and not dynamo:  # softmax(dtype=float32).to(float16), as the TorchScript exporter writes it
        probs = b.op("Cast", b.op("Cast", probs, to=TensorProto.FLOAT), to=elem)
    if dynamo:
        probs = b.op("Where", b.op("IsNaN", probs), scalar(0), probs)
    context = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    if merge == "rows":
        merged = b.op("Reshape", context, ints(-1, hidden))
    elif dynamo:
        merged = b.op("Reshape", context, b.op("Concat", batch_seq, ints(-1), axis=0), allowzero=1)
    else:
        merged = b.op("Reshape", context, ints(0, 0, hidden))
    y = b.op("MatMul", merged, b.const((b.rand(hidden, hidden) * hidden**-0.5).astype(np_dtype)))
    model = b.build(y, *presents, output_names=["y", "present_key", "present_value"][:1 + len(presents)])
    for present in model.graph.output[1:]:  # the length exporters declare, not onnx's unk__N for a Concat's sum
        present.type.tensor_type.shape.dim[2].dim_param = "past_sequence + sequence" if cache == "past" else str(seq)
    return model
