"""com.microsoft MultiHeadAttention: attention over projected Q, K, V (attention, cached-attention).

Memory (contrib_ops/cpu/bert/multihead_attention.cc): query, key and value, bias added, are
copied into [B, N, S, H], [B, N, L, H] and [B, N, L, H_v] buffers from the temp-space allocator
(MaybeTransposeToBNSHAndAddBias, attention_utils.cc): as many bytes as the three inputs, all
held until the kernel returns, together with its inputs and output. Key and value given as
[B, N, L, H] are used as they are, not copied. With no mask, attention bias, past or present,
and not unidirectional, it runs MlasFlashAttention, whose tile buffer is a few Q rows by a block
of keys per thread, sized to the L2 cache. Otherwise ApplyAttention (attention_cpu_base.h) also
holds the attention probabilities [B, N, S, T] (T = past + L) and the output before its
transpose [B, N, S, H_v] until it returns; measured with a key padding mask, no [B, S, T] mask
buffer stayed resident. Measured on onnxruntime 1.31 for batch, sequence, key length, heads and
head size: within 0.2 MiB of the formula.
"""

from __future__ import annotations

import functools

import onnx
from onnx import TensorProto, helper

from fuse_cli.core.tensors import element_size_bits
from fuse_cli.ops.record import MS, Contract, Input, Operator, Probe, Shapes, Spec, kernels
from fuse_cli.ops.rules import attributes, static_shape

_B, _S, _H, _D = Probe.B, Probe.S, Probe.H, Probe.D


def _output_shape(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """onnxruntime's inference (MultiHeadAttentionTypeAndShapeInference, bert_defs.cc) writes
    [query[0], query[1], value[2]] for a 3-D value and [query[0], query[1], value[1] * value[3]]
    for a 4-D one ([B, N, L, H]), whatever the ranks: an Einsum that takes the query's first two
    dims and the value's dims but its first and its key length ([Dv] or [N, H]), flattened into
    one ([?, Dv] or [?, N * H]: a single dim keeps its name), then put behind the query's first
    two. The product's dims must be the query's, never a broadcast with the value's: onnxruntime's
    planner compares them (analysis/planner.py), and a stand-in that lost them, or got the rank
    wrong, kept every tensor after attention from sharing a buffer where onnxruntime does."""
    inputs, out = list(node.input), node.output[0]
    if len(inputs) < 3 or not inputs[1] or not inputs[2]:
        return []
    if opset >= 12:
        heads, flat = f"{out}::fuse-value-heads", f"{out}::fuse-value-flat"
        return [helper.make_node("Einsum", [inputs[0], inputs[2]], [heads], equation="bsd,z...lh->bs...h"),
                helper.make_node("Flatten", [heads], [flat], axis=2),
                helper.make_node("Einsum", [inputs[0], flat], [out], equation="bsd,kx->bsx")]
    # Before Einsum: [B, S, D] x [B, L, D]^T x [B, L, Dv] -> [B, S, Dv], for a 3-D value only.
    key_t, scores = f"{out}::fuse-key-t", f"{out}::fuse-scores"
    return [helper.make_node("Transpose", [inputs[1]], [key_t], perm=[0, 2, 1]),
            helper.make_node("MatMul", [inputs[0], key_t], [scores]),
            helper.make_node("MatMul", [scores, inputs[2]], [out])]


# Inputs that turn MlasFlashAttention off: key_padding_mask, attention_bias, past_key,
# past_value, past_sequence_length, cache_indirection.
_UNFLASHED_INPUTS = range(4, 10)
_SC_LEVEL2_CACHE_SIZE = 191  # glibc's sysconf name; Python's os.sysconf does not list it


@functools.cache
def l2_cache_bytes() -> int:
    """The L2 cache size onnxruntime reads (sysconf(_SC_LEVEL2_CACHE_SIZE) on Linux); 0 when
    unknown, where its flash attention is off."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return max(0, int(libc.sysconf(_SC_LEVEL2_CACHE_SIZE)))
    except (OSError, AttributeError, ValueError):
        return 0


def flash_attention_buffer(query_length: int, kv_length: int, qk_head: int, v_head: int, threads: int = 1) -> int:
    """MlasFlashAttention's per-thread blocks, in floats (multihead_attention.cc): Bc rows of K/V
    so that the blocks fill 3/4 of the L2 cache, Br = min(Bc, qk_head + v_head) rows of Q, each
    capped by its sequence; per thread Br * (2 + Bc + v_head). 0 where flash does not run."""
    l2 = l2_cache_bytes()
    if l2 <= 0:
        return 0
    kv_rows = max(l2 // (4 * 4 * (qk_head + v_head)), 1)
    q_rows = min(kv_rows, qk_head + v_head, query_length)
    kv_rows = min(kv_rows, kv_length)
    return threads * q_rows * (2 + kv_rows + v_head)


def _workspace(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The temp-space buffers on the CPU provider (one intra-op thread), in bytes; 0 when unknown.
    Q, K, V are copied head-major one after the other; with a bias, each that is longer than one
    position is first summed into a [B, S, D] temporary and transposed from it. Then either flash
    attention's per-thread blocks or the probabilities [B, N, S, T] and the output before its
    transpose. Checked against the allocator's exact count (tests/test_analysis_measure.py)."""
    inputs = list(node.input) + [""] * 10
    attrs = attributes(node)
    heads = int(attrs.get("num_heads", 0))
    query, key, value = (static_shape(shapes, name) for name in inputs[:3])
    info = shapes.get(inputs[0])
    bits = element_size_bits(info.elem_type) if info is not None else None
    if heads <= 0 or bits is None or query is None or len(query) != 3 or key is None or value is None:
        return 0  # packed QKV (5-D) has no CPU kernel; without key, nothing we can size
    size = bits // 8
    batch, sequence, hidden = query
    q = batch * sequence * hidden
    if len(key) == 3 and len(value) == 3:
        kv_length, v_hidden = key[1], value[2]
        k, v = batch * kv_length * hidden, batch * kv_length * v_hidden
        biased = bool(inputs[3])
        q_temp, k_temp, v_temp = (x if biased and length > 1 else 0
                                  for x, length in ((q, sequence), (k, kv_length), (v, kv_length)))
        copies = q + k + v
        transient = max(q + q_temp, q + k + k_temp, copies + v_temp)
        flash = (not any(inputs[i] for i in _UNFLASHED_INPUTS)
                 and not any(node.output[1:]) and not int(attrs.get("unidirectional", 0))
                 and info.elem_type == TensorProto.FLOAT and l2_cache_bytes() > 0)
    elif len(key) == 4 and len(value) == 4:  # [B, N, L, H]: used in place, and never flash
        kv_length, v_hidden = key[2], value[1] * value[3]
        copies, flash = q, False
        transient = copies
    else:
        return 0
    if flash:
        extra = flash_attention_buffer(sequence, kv_length, hidden // heads, v_hidden // heads)
    else:
        past = static_shape(shapes, inputs[6])
        total = kv_length + (past[2] if past is not None and len(past) == 4 else 0)
        extra = batch * heads * sequence * total + batch * sequence * v_hidden
    return size * max(transient, copies + extra)


RECORDS = (Operator(
    "MultiHeadAttention", MS,
    support=kernels("MultiHeadAttention", "float32", "float32 float16 bfloat16", "num_heads required"),
    probe=Spec("MultiHeadAttention", MS, (Input("query", Probe.X3), Input("key", Probe.X3), Input("value", Probe.X3),
                                          Input("bias", (3 * _H * _D,), True), Input("key_padding_mask", (), True),
                                          Input("attention_bias", (_B, _H, _S, _S), True)), {"num_heads": _H}),
    contracts=tuple(Contract("MultiHeadAttention", MS, "float32", ("key_padding_mask", *absent),
                             ("attention", "cached-attention"))
                    for absent in ((), ("bias",), ("attention_bias",), ("bias", "attention_bias"))),
    stand_in=_output_shape,
    workspace=_workspace,
),)
