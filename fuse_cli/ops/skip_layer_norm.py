"""com.microsoft SkipLayerNormalization and SkipSimplifiedLayerNormalization: a residual Add and the
norm in one kernel (skip-layer-norm, skip-simplified-layer-norm). CUDA only: the CPU kernels were
measured slower (the Slower rows take the passes out of the CPU targets); the CPU kernel is what
the contracts probe."""

from __future__ import annotations

from fuse_cli.ops.record import MS, Contract, Input, Operator, Probe, Slower, Spec, kernels
from fuse_cli.ops.rules import same_as_input_0

_HIDDEN = (Probe.H * Probe.D,)


def _slower(op: str) -> Slower:
    return Slower(op, "cpu", f"onnxruntime 1.31's CPU {op} measured 6.6x slower than the unfused Adds and norm",
                  "390 vs 59 us at [1, 128, 768], one thread, against the Add + Add + LayerNormalization it replaces; "
                  "onnxruntime's own optimizer makes the same fusion at level all (see api._run_level_note)",
                  leaves_pipeline=True)


RECORDS = (
    Operator(
        "SkipLayerNormalization", MS,
        support=kernels("SkipLayerNormalization", "float32 float16 bfloat16", "float32 float16 bfloat16",
                        "epsilon defaults to 1e-12, not LayerNormalization's 1e-5: always set it"),
        slower=(_slower("SkipLayerNormalization"),),
        probe=Spec("SkipLayerNormalization", MS, (Input("input", Probe.X3), Input("skip", Probe.X3),
                                                  Input("gamma", _HIDDEN), Input("beta", _HIDDEN, True),
                                                  Input("bias", _HIDDEN, True)),
                   {"epsilon": 1e-5}),
        contracts=tuple(Contract("SkipLayerNormalization", MS, dtype, absent, ("skip-layer-norm",))
                        for dtype in ("float32", "float16") for absent in ((), ("beta",), ("bias",), ("beta", "bias"))),
        stand_in=same_as_input_0,
    ),
    Operator(
        "SkipSimplifiedLayerNormalization", MS,
        support=kernels("SkipSimplifiedLayerNormalization", "float32 float16 bfloat16", "float32 float16 bfloat16",
                        "epsilon defaults to 1e-12: always set it"),
        slower=(_slower("SkipSimplifiedLayerNormalization"),),
        probe=Spec("SkipSimplifiedLayerNormalization", MS, (Input("input", Probe.X3), Input("skip", Probe.X3),
                                                            Input("gamma", _HIDDEN), Input("bias", _HIDDEN, True)),
                   {"epsilon": 1e-5}),
        contracts=tuple(Contract("SkipSimplifiedLayerNormalization", MS, dtype, absent, ("skip-simplified-layer-norm",))
                        for dtype in ("float32", "float16") for absent in ((), ("bias",))),
        stand_in=same_as_input_0,
    ),
)
