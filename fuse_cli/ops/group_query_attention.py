"""com.microsoft GroupQueryAttention: attention whose query heads share K/V heads (group-query-attention)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from fuse_cli.core.tensors import element_size_bits
from fuse_cli.ops.record import MS, Contract, Input, Operator, Probe, Shapes, Slower, Spec, Unchecked, kernels
from fuse_cli.ops.rules import attributes, same_as_input_0

_B, _S = Probe.B, Probe.S


def _with_presents(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """Output 0 has the query's shape. Without a past, present_key/present_value are the key and
    value split into heads, [B, kv_num_heads, S, head_size] (GroupQueryAttentionTypeAndShapeInference,
    bert_defs.cc). Left unsized, the kernel's present-sized scratch and the presents themselves went
    uncounted: bert-base's dynamo export, fused, measured 1.9x its estimate."""
    inputs, out = list(node.input), node.output[0]
    if any(inputs[3:5]) or len(inputs) <= 2 or not inputs[1] or not inputs[2]:
        return same_as_input_0(node, opset)
    kv_heads = int(attributes(node).get("kv_num_heads", 0))
    nodes = same_as_input_0(node, opset)
    heads = helper.make_tensor(f"{out}__kv_heads", TensorProto.INT64, [4], [0, 0, kv_heads, -1])
    for source, present in zip(inputs[1:3], list(node.output[1:3])):
        if present and kv_heads:
            split = f"{present}__split"
            nodes += [helper.make_node("Constant", [], [f"{split}_shape"], value=heads),
                      helper.make_node("Reshape", [source, f"{split}_shape"], [split]),
                      helper.make_node("Transpose", [split], [present], perm=[0, 2, 1, 3])]
    return nodes


def _workspace(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The scratch on the CPU provider (group_query_attention.cc), in bytes; 0 when unknown: a
    head-major query copy [B, N, S, H], present-sized K/V buffers [B, KV, T, H] each (the kernel
    builds them when the present outputs are not requested, and as much again when they are), and
    the probabilities [B, N, S, T], which only a causal kernel (causal=1, the default) returning its
    presents does without. Measured on onnxruntime 1.31.1 with an attention_bias and no past at
    B 2-64, S 64-512, N 4-16, KV 2-8, H 32-128, causal 0 and 1, with and without the present
    outputs: within 0.25 MiB of that sum (tests/test_analysis_measure.py). fuse emits causal=0
    (the graph's own mask is the bias): the probabilities are always there.

    In float16 the kernel computes in float32 (gqa_attention_base.h): the probabilities are float32
    whatever `causal` says, the output is gathered in a float32 [B, S, N, H] buffer before its
    conversion, and each head's V is converted into a float32 [T, H] block beside them. Measured on
    1.31.1 at B 4, S 256, N 8, KV 2, H 64: 14.57 MiB allocated against 8.5 estimated at float16's
    width; those three give 14.56, causal 0 and 1."""
    inputs = list(node.input) + [""] * 11
    attrs = attributes(node)
    heads, kv_heads = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    query, key = shapes.get(inputs[0]), shapes.get(inputs[1])
    if (heads <= 0 or kv_heads <= 0 or query is None or key is None or query.shape is None or key.shape is None
            or len(query.shape) != 3 or len(key.shape) != 3
        or not all(isinstance(d, int) for d in query.shape + key.shape)):
        return 0  # packed QKV, or sizes unknown
    bits = element_size_bits(query.elem_type)
    if bits is None:
        return 0
    batch, sequence, hidden = query.shape
    head_size = hidden // heads
    past = shapes.get(inputs[3])
    total = key.shape[1] + (past.shape[2] if past is not None and past.shape is not None and len(past.shape) == 4
                            and isinstance(past.shape[2], int) else 0)
    query_copy = batch * heads * sequence * head_size
    presents = 2 * batch * kv_heads * total * head_size
    probabilities = batch * heads * sequence * total
    if query.elem_type == TensorProto.FLOAT16:
        float32_buffers = probabilities + batch * sequence * heads * head_size + total * head_size
        return 2 * (query_copy + presents) + 4 * float32_buffers
    causal = int(attrs.get("causal", 1))
    return bits // 8 * (query_copy + presents + (0 if causal and any(node.output[1:3]) else probabilities))


def softcap_slower(op: str) -> Slower:
    """The measured cost of `op`'s soft cap on the CPU (GroupQueryAttention here, the standard
    Attention too): emitted without it or not at all."""
    return Slower(
        f"{op}:softcap", "cpu",
        f"onnxruntime 1.31's CPU {op} with a soft cap measured 1.5-2.0x the decomposed attention's time "
        f"(its softcap pass costs 5x the rest of the kernel; target {{target}})",
        "gemma2 prefill (the decoder corpus, 2 layers, 4 heads of 32), batch 1 x 128, one thread, 50 runs: "
        "the original 1.06-1.09 ms at graph optimization disabled and 0.80-0.82 at all; fuse's output with "
        "GroupQueryAttention(softcap) 1.59-1.63 and 1.59-1.63 (benchmarks/llm_bench.py: 1.42 / 1.98 opset 17, "
        "1.74 / 1.88 dynamo); the same nodes without the softcap attribute 0.70 and 0.73; the standard "
        "Attention (opset 23) with softcap 1.62 and 1.59, the decomposed form at opset 23 0.76 and 0.73.")


RECORDS = (Operator(
    "GroupQueryAttention", MS,
    support=kernels(
        "GroupQueryAttention", "float32 float16", "float16 bfloat16",
        "head size % 8 == 0 on CPU; num_heads and kv_num_heads required; seqlens_k [B] int32 and "
        "total_sequence_length int32 inputs. With causal=0 and attention_bias (the graph's own mask) the 1.31 CPU "
        "kernel equals softmax(QK^T*scale + bias)V over repeat_kv'd K/V, fully masked rows included "
        "(one-node check, 2026-12-01); CUDA with causal=0 unverified: group-query-attention declines there. With "
        "past_key/past_value given the CPU kernel refuses batch > 1 when sequence > 1 (1.31.1: \"batch_size must "
        "be 1 when sequence_length > 1 and past context is given\", one-node check): a decode step with the "
        "cache (cached-attention) goes to MultiHeadAttention, which takes any batch and step length"),
    slower=(softcap_slower("GroupQueryAttention"),),
    unchecked=(Unchecked("GroupQueryAttention", "cuda",
                         "GroupQueryAttention with causal=0 and an attention_bias is verified on onnxruntime's CPU "
                         "provider only (target {target}); --target ort-cpu fuses it"),),
    # the CPU kernel takes head sizes that are multiples of 8: 2 query heads of 8 over 1 K/V head
    probe=Spec("GroupQueryAttention", MS, (
        Input("query", (_B, _S, 16)), Input("key", (_B, _S, 8)), Input("value", (_B, _S, 8)),
        Input("past_key", (), True), Input("past_value", (), True),
        Input("seqlens_k", (_B,), integers=(_S - 1, _S), integer_dtype="int32"),
        Input("total_sequence_length", (), integers=(_S, _S + 1), integer_dtype="int32"),
        Input("cos_cache", (), True), Input("sin_cache", (), True),
        Input("position_ids", (), True), Input("attention_bias", (_B, 2, _S, _S), True)),
        {"num_heads": 2, "kv_num_heads": 1, "causal": 0}),
    contracts=tuple(Contract("GroupQueryAttention", MS, dtype, ("past_key", "past_value", "cos_cache", "sin_cache",
                                                                "position_ids", *absent), ("group-query-attention",))
                    for dtype in ("float32", "float16") for absent in ((), ("attention_bias",))),
    stand_in=_with_presents,
    workspace=_workspace,
),)
