"""com.microsoft Attention: attention with packed Q/K/V projection weights (packed-attention)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from fuse_cli.core.tensors import element_size_bits
from fuse_cli.ops.record import MS, Contract, Input, Operator, Probe, Shapes, Spec, Unchecked, kernels
from fuse_cli.ops.rules import attributes

_B, _S, _H, _D = Probe.B, Probe.S, Probe.H, Probe.D


def _projected_value(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """[input[0], input[1], v_hidden] (AttentionTypeAndShapeInference, bert_defs.cc): V's slice of
    the packed weights, qkv_hidden_sizes[2] or a third of their width, projected."""
    inputs, out = list(node.input), node.output[0]
    if len(inputs) < 2 or not inputs[1]:
        return []
    value_weight = f"{out}::fuse-value-weight"
    sizes = attributes(node).get("qkv_hidden_sizes")
    if sizes:
        bounds = [f"{out}::fuse-value-{end}" for end in ("start", "end", "axis")]
        values = ([int(sizes[0]) + int(sizes[1])], [int(sum(sizes))], [1])
        nodes = [helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [1], v))
                 for name, v in zip(bounds, values)]
        nodes.append(helper.make_node("Slice", [inputs[1], *bounds], [value_weight]))
    else:
        parts = [f"{out}::fuse-{role}-weight" for role in ("query", "key")] + [value_weight]
        nodes = [helper.make_node("Split", inputs[1:2], parts, axis=1, **({"num_outputs": 3} if opset >= 18 else {}))]
    return [*nodes, helper.make_node("MatMul", [inputs[0], value_weight], [out])]


def _workspace(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The scratch on the CPU provider, in bytes; 0 when unknown: the projections [B, S, q+k+v]
    (one GEMM into a temp-space buffer, attention.cc), then, as MultiHeadAttention without flash
    (ApplyAttention), the probabilities [B, N, S, T] and the output before its transpose [B, S, v].
    Measured on onnxruntime 1.31.1 with an attention_bias and no past (tests/test_analysis_measure.py)."""
    attrs = attributes(node)
    heads = int(attrs.get("num_heads", 0))
    x, weights = (shapes.get(name) for name in (list(node.input) + [""])[:2])
    if (heads <= 0 or x is None or weights is None or x.shape is None or weights.shape is None or len(x.shape) != 3
            or len(weights.shape) != 2 or not all(isinstance(d, int) for d in x.shape + weights.shape)):
        return 0
    bits = element_size_bits(x.elem_type)
    if bits is None or len(node.input) > 4 and node.input[4]:
        return 0  # a past: not what fuse emits, not measured
    batch, sequence, _ = x.shape
    packed = weights.shape[1]
    v_hidden = int(attrs["qkv_hidden_sizes"][2]) if attrs.get("qkv_hidden_sizes") else packed // 3
    return bits // 8 * batch * sequence * (packed + heads * sequence + v_hidden)


_BIAS_CRASH = ("onnxruntime-gpu 1.31.1's CPU kernel crashes (SIGSEGV) without its bias input, at every shape "
               "(1.32.0 runs it): packed-attention gives it a zero bias")

RECORDS = (Operator(
    "Attention", MS,
    support=kernels("Attention", "float32", "float32 float16 bfloat16",
                    "num_heads required; packed QKV weights [hidden, q+k+v] and bias; the graph's mask as "
                    "attention_bias. "
                    "CPU time 0.91-0.97x the Q/K/V MatMuls + MultiHeadAttention it replaces (packed-attention; "
                    "benchmarks/results/bert_packed_attention.md)"),
    unchecked=(Unchecked("Attention", "cuda",
                         "the packed-QKV Attention was measured faster than the Q/K/V MatMuls and MultiHeadAttention "
                         "on onnxruntime's CPU provider only (target {target}); --target ort-cpu fuses it"),),
    probe=Spec("Attention", MS, (Input("input", Probe.X3), Input("weights", (_H * _D, 3 * _H * _D)),
                                 Input("bias", (3 * _H * _D,), True), Input("mask_index", (), True),
                                 Input("past", (), True), Input("attention_bias", (_B, _H, _S, _S), True)),
               {"num_heads": _H}),
    contracts=(
        Contract("Attention", MS, "float32", ("mask_index", "past"), ("packed-attention",)),
        Contract("Attention", MS, "float32", ("mask_index", "past", "attention_bias"), ("packed-attention",)),
        Contract("Attention", MS, "float32", ("bias", "mask_index", "past"), refused=_BIAS_CRASH),
        Contract("Attention", MS, "float32", ("bias", "mask_index", "past", "attention_bias"), refused=_BIAS_CRASH),
    ),
    stand_in=_projected_value,
    workspace=_workspace,
),)
