"""The standard Attention of opset 23 (standard-attention, standard-cached-attention, `--target onnx`)."""

from __future__ import annotations

from fuse_cli.ops.group_query_attention import softcap_slower
from fuse_cli.ops.record import Contract, Input, Operator, Probe, Spec, kernels

_B, _S, _H, _D = Probe.B, Probe.S, Probe.H, Probe.D

RECORDS = (Operator(
    "Attention",
    support=kernels(
        "Attention", "float32 float16", "",
        "opset 23; Q, K, V all 3-D (q_num_heads, kv_num_heads) or all 4-D: 3-D Q with 4-D K/V fails at run time "
        "(attention_helper.h:39 ComputeOutputShapeForAttention). float64 loads but runs as the function body "
        "(60 elementwise nodes), not a kernel. An attn_mask [B, 1, 1, T] (padding only, broadcast over the queries) "
        "fails at run time (attention_helper.h:98 ComputeOutputShapeForAttention); [B or 1, 1 or H, S, T] runs. CPU "
        "time 0.66-0.96x the decomposed form (benchmarks/results/opset23.md). onnxruntime also runs present outputs "
        "without past inputs, which the standard forbids: fuse never emits that",
        domain=""),
    standard=True,
    slower=(softcap_slower("Attention"),),
    probe=Spec("Attention", "", (Input("Q", (_B, _H, _S, _D)), Input("K", (_B, _H, _S, _D)),
                                 Input("V", (_B, _H, _S, _D)), Input("attn_mask", (_B, _H, _S, _S), True)), opset=23),
    contracts=tuple(Contract("Attention", "", dtype, absent, ("standard-attention", "standard-cached-attention"))
                    for dtype in ("float32", "float16") for absent in ((), ("attn_mask",))),
),)
