"""Kernel contracts: which forms of the operators fuse emits the pinned onnxruntime runs correctly.

targets.py says which operator has a kernel at which dtype; a kernel can still crash or compute
something else for one form of the node: onnxruntime-gpu 1.31.1's CPU com.microsoft Attention
segfaults without its bias input, at every shape. A form here is an operator at a dtype with
some of its optional inputs left empty, as a pass may write it. Each was probed with one-node
models in the worker process (core/isolation.py, so a crash is a finding), against a reference:
- an optional input left empty against the same node given that input's neutral value (zeros for
  a bias, an added residual or an additive mask): "absent" must mean "neutral";
- float16 against the same node in float32 on the same values, at float16's tolerance.
What a form computes with every input present, at float32, each pass's own tests check against
the unfused original. tests/test_kernel_contracts.py probes every row against the installed
runtime. A row with `refused` is a form the passes must not emit (the reason, as measured).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MS = "com.microsoft"


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    optional: bool = False
    integers: tuple[int, int] | None = None  # integer values in [low, high); None: the float dtype
    integer_dtype: str = "int64"


@dataclass(frozen=True)
class Spec:
    """A one-node probe of `op`: its inputs in order (an optional one may be left empty) and attributes."""

    op: str
    domain: str
    inputs: tuple[Input, ...]
    attrs: dict = field(default_factory=dict)
    opset: int = 17  # the default domain's


@dataclass(frozen=True)
class Contract:
    op: str
    domain: str  # "" for the default domain
    dtype: str
    absent: tuple[str, ...] = ()  # optional inputs left empty
    emitted_by: tuple[str, ...] = ()  # the passes that write this form
    refused: str | None = None  # None: runs and agrees with the reference; else what the probe found

    @property
    def label(self) -> str:
        where = f"{self.domain}::{self.op}" if self.domain else self.op
        return f"{where} {self.dtype}" + (f" without {', '.join(self.absent)}" if self.absent else "")


# batch 2, sequence 3, 2 heads of 4
_B, _S, _H, _D = 2, 3, 2, 4
_X3 = (_B, _S, _H * _D)
SPECS: dict[tuple[str, str], Spec] = {(s.op, s.domain): s for s in (
    Spec("FusedConv", MS, (Input("X", (2, 3, 5, 5)), Input("W", (4, 3, 3, 3)), Input("B", (4,), True),
                           Input("Z", (2, 4, 5, 5), True)), {"activation": "Relu", "pads": [1, 1, 1, 1]}),
    Spec("FusedGemm", MS, (Input("A", (3, 4)), Input("B", (4, 5)), Input("C", (5,), True)), {"activation": "Relu"}),
    Spec("FusedMatMul", MS, (Input("A", (2, 3, 4)), Input("B", (2, 5, 4))), {"alpha": 0.5, "transB": 1}),
    Spec("Gelu", MS, (Input("X", _X3),)),
    Spec("QuickGelu", MS, (Input("X", _X3),), {"alpha": 1.702}),
    Spec("BiasGelu", MS, (Input("A", _X3), Input("bias", (_H * _D,)))),
    Spec("FastGelu", MS, (Input("X", _X3), Input("bias", (_H * _D,), True))),
    Spec("SkipLayerNormalization", MS, (Input("input", _X3), Input("skip", _X3), Input("gamma", (_H * _D,)),
                                        Input("beta", (_H * _D,), True), Input("bias", (_H * _D,), True)),
         {"epsilon": 1e-5}),
    Spec("SkipSimplifiedLayerNormalization", MS, (Input("input", _X3), Input("skip", _X3),
                                                  Input("gamma", (_H * _D,)), Input("bias", (_H * _D,), True)),
         {"epsilon": 1e-5}),
    Spec("MultiHeadAttention", MS, (Input("query", _X3), Input("key", _X3), Input("value", _X3),
                                    Input("bias", (3 * _H * _D,), True), Input("key_padding_mask", (), True),
                                    Input("attention_bias", (_B, _H, _S, _S), True)), {"num_heads": _H}),
    Spec("Attention", MS, (Input("input", _X3), Input("weights", (_H * _D, 3 * _H * _D)),
                           Input("bias", (3 * _H * _D,), True), Input("mask_index", (), True),
                           Input("past", (), True), Input("attention_bias", (_B, _H, _S, _S), True)),
         {"num_heads": _H}),
    # the CPU kernel takes head sizes that are multiples of 8: 2 query heads of 8 over 1 K/V head
    Spec("GroupQueryAttention", MS, (Input("query", (_B, _S, 16)), Input("key", (_B, _S, 8)), Input("value", (_B, _S, 8)),
                                     Input("past_key", (), True), Input("past_value", (), True),
                                     Input("seqlens_k", (_B,), integers=(_S - 1, _S), integer_dtype="int32"),
                                     Input("total_sequence_length", (), integers=(_S, _S + 1), integer_dtype="int32"),
                                     Input("cos_cache", (), True), Input("sin_cache", (), True),
                                     Input("position_ids", (), True), Input("attention_bias", (_B, 2, _S, _S), True)),
         {"num_heads": 2, "kv_num_heads": 1, "causal": 0}),
    Spec("RotaryEmbedding", MS, (Input("input", _X3), Input("position_ids", (_B, _S), integers=(0, _S)),
                                 Input("cos_cache", (_S, _D // 2)), Input("sin_cache", (_S, _D // 2))),
         {"num_heads": _H}),
    Spec("SimplifiedLayerNormalization", "", (Input("X", _X3), Input("scale", (_H * _D,))),
         {"axis": -1, "epsilon": 1e-5}),
    Spec("RMSNormalization", "", (Input("X", _X3), Input("scale", (_H * _D,))), {"epsilon": 1e-5}, opset=23),
    Spec("Attention", "", (Input("Q", (_B, _H, _S, _D)), Input("K", (_B, _H, _S, _D)), Input("V", (_B, _H, _S, _D)),
                           Input("attn_mask", (_B, _H, _S, _S), True)), opset=23),
    Spec("RotaryEmbedding", "", (Input("X", (_B, _H, _S, _D)), Input("cos_cache", (_B, _S, _D // 2)),
                                 Input("sin_cache", (_B, _S, _D // 2))), opset=23),
)}

_BIAS_CRASH = ("onnxruntime-gpu 1.31.1's CPU kernel crashes (SIGSEGV) without its bias input, at every shape "
               "(1.32.0 runs it): packed-attention gives it a zero bias")

CONTRACTS: tuple[Contract, ...] = (
    *(Contract("FusedConv", MS, "float32", absent, ("fused-conv",)) for absent in ((), ("B",), ("Z",), ("B", "Z"))),
    Contract("FusedGemm", MS, "float32", (), ("fused-gemm",)),
    Contract("FusedGemm", MS, "float32", ("C",), ("fused-gemm",)),
    Contract("FusedMatMul", MS, "float32", (), ("fused-matmul",)),
    Contract("Gelu", MS, "float32", (), ("contrib-gelu",)),
    Contract("QuickGelu", MS, "float32", (), ("quick-gelu",)),
    Contract("BiasGelu", MS, "float32", (), ("bias-gelu",)),
    Contract("FastGelu", MS, "float32", (), ("fast-gelu",)),
    Contract("FastGelu", MS, "float32", ("bias",), ("fast-gelu",)),
    # CUDA only (targets.SLOWER takes the passes out of the CPU targets); the CPU kernel is what is probed here
    *(Contract("SkipLayerNormalization", MS, dtype, absent, ("skip-layer-norm",))
      for dtype in ("float32", "float16") for absent in ((), ("beta",), ("bias",), ("beta", "bias"))),
    *(Contract("SkipSimplifiedLayerNormalization", MS, dtype, absent, ("skip-simplified-layer-norm",))
      for dtype in ("float32", "float16") for absent in ((), ("bias",))),
    *(Contract("MultiHeadAttention", MS, "float32", ("key_padding_mask", *absent), ("attention", "cached-attention"))
      for absent in ((), ("bias",), ("attention_bias",), ("bias", "attention_bias"))),
    Contract("Attention", MS, "float32", ("mask_index", "past"), ("packed-attention",)),
    Contract("Attention", MS, "float32", ("mask_index", "past", "attention_bias"), ("packed-attention",)),
    Contract("Attention", MS, "float32", ("bias", "mask_index", "past"), refused=_BIAS_CRASH),
    Contract("Attention", MS, "float32", ("bias", "mask_index", "past", "attention_bias"), refused=_BIAS_CRASH),
    *(Contract("GroupQueryAttention", MS, dtype, ("past_key", "past_value", "cos_cache", "sin_cache", "position_ids",
                                                  *absent), ("group-query-attention",))
      for dtype in ("float32", "float16") for absent in ((), ("attention_bias",))),
    *(Contract("RotaryEmbedding", MS, dtype, (), ("rotary-embedding", "rotary-before-head-split"))
      for dtype in ("float32", "float16")),
    *(Contract("SimplifiedLayerNormalization", "", dtype, (), ("simplified-layer-norm",))
      for dtype in ("float32", "float16")),
    Contract("RMSNormalization", "", "float32", (), ("rms-norm",)),
    *(Contract("Attention", "", dtype, absent, ("standard-attention", "standard-cached-attention"))
      for dtype in ("float32", "float16") for absent in ((), ("attn_mask",))),
    *(Contract("RotaryEmbedding", "", dtype, (), ("standard-rotary-embedding",)) for dtype in ("float32", "float16")),
)


def refused_forms(op: str, domain: str) -> tuple[Contract, ...]:
    """The probed forms of `op` the passes must not write, with what the probe found."""
    return tuple(c for c in CONTRACTS if (c.op, c.domain) == (op, domain) and c.refused)
