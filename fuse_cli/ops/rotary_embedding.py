"""RotaryEmbedding: onnxruntime's com.microsoft kernel (rotary-embedding, rotary-before-head-split)
and the standard one of opset 23 (standard-rotary-embedding, `--target onnx`), whose inputs come
in a different order."""

from __future__ import annotations

from fuse_cli.ops.record import MS, Contract, Input, Operator, Probe, Spec, kernels
from fuse_cli.ops.rules import same_as_input_0

_B, _S, _H, _D = Probe.B, Probe.S, Probe.H, Probe.D

RECORDS = (
    Operator(
        "RotaryEmbedding", MS,
        support=kernels(
            "RotaryEmbedding", "float32 float16", "float32 float16 bfloat16",
            "inputs (input, position_ids, cos, sin): not the order of the standard opset-23 RotaryEmbedding. input "
            "[B, S, H*d] (with num_heads) or [B, H, S, d]; position_ids [1] (row start + s) or [B, S]; caches "
            "[rows, d/2]: rotary-embedding passes the graph's own per-position cos/sin rows with position_ids [0], so "
            "no table of max positions is built"),
        probe=Spec("RotaryEmbedding", MS, (Input("input", Probe.X3), Input("position_ids", (_B, _S), integers=(0, _S)),
                                           Input("cos_cache", (_S, _D // 2)), Input("sin_cache", (_S, _D // 2))),
                   {"num_heads": _H}),
        contracts=tuple(Contract("RotaryEmbedding", MS, dtype, (), ("rotary-embedding", "rotary-before-head-split"))
                        for dtype in ("float32", "float16")),
        stand_in=same_as_input_0,
    ),
    Operator(
        "RotaryEmbedding",
        support=kernels(
            "RotaryEmbedding", "float32 float16", "",
            "opset 23; inputs (X, cos_cache, sin_cache, position_ids?); float64: the schema refuses it. Without "
            "position_ids the caches must be [B, S, d/2] of x's own batch: a batch-1 cache for batch 2 fails at "
            "run time (\"Inputs 'cos_cache' and 'sin_cache' are expected to have the same shape as input 'x', "
            "got 1 and 5\"). CPU time 0.83-0.95x the decomposed form, 1.02x on two 128-token prefills "
            "(within the shared CPU's noise: not "
            "declined; benchmarks/results/opset23.md)",
            domain=""),
        standard=True,
        probe=Spec("RotaryEmbedding", "", (Input("X", (_B, _H, _S, _D)), Input("cos_cache", (_B, _S, _D // 2)),
                                           Input("sin_cache", (_B, _S, _D // 2))), opset=23),
        contracts=tuple(Contract("RotaryEmbedding", "", dtype, (), ("standard-rotary-embedding",))
                        for dtype in ("float32", "float16")),
    ),
)
