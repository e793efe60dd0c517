"""RMS normalization: onnxruntime's SimplifiedLayerNormalization (simplified-layer-norm) and the
standard RMSNormalization of opset 23 (rms-norm, `--target onnx`)."""

from __future__ import annotations

from fuse_cli.ops.record import Contract, Input, Operator, Probe, Spec, kernels
from fuse_cli.ops.rules import same_as_input_0

_HIDDEN = (Probe.H * Probe.D,)

RECORDS = (
    Operator(
        "SimplifiedLayerNormalization",
        support=kernels("SimplifiedLayerNormalization", "float32 float16 bfloat16 float64",
                        "float32 float16 bfloat16 float64",
                        "default domain but not standard ONNX (onnx.checker rejects it); "
                        "the standard form is RMSNormalization, opset 23",
                        domain=""),
        probe=Spec("SimplifiedLayerNormalization", "", (Input("X", Probe.X3), Input("scale", _HIDDEN)),
                   {"axis": -1, "epsilon": 1e-5}),
        contracts=tuple(Contract("SimplifiedLayerNormalization", "", dtype, (), ("simplified-layer-norm",))
                        for dtype in ("float32", "float16")),
        # registered by onnxruntime in the default domain; onnx has no inference for it
        stand_in=same_as_input_0,
    ),
    Operator(
        "RMSNormalization",
        support=kernels("RMSNormalization", "float32 float16 float64", "",
                        "opset 23; bfloat16 not probed; rms-norm emits it for float32, and for float16 with "
                        "stash_type 1 (torch's half form). CPU time 0.61-0.95x the decomposed form in decoder "
                        "exports (benchmarks/results/opset23.md)", domain=""),
        standard=True,
        probe=Spec("RMSNormalization", "", (Input("X", Probe.X3), Input("scale", _HIDDEN)), {"epsilon": 1e-5},
                   opset=23),
        contracts=tuple(Contract("RMSNormalization", "", dtype, (), ("rms-norm",)) for dtype in ("float32", "float16")),
    ),
)
