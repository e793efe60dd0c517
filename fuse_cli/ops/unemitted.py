"""onnxruntime operators no pass emits, with no CPU kernel: listed so that the operator table
`fuse passes` prints says where each runs."""

from __future__ import annotations

from fuse_cli.ops.record import MS, Operator, kernels

RECORDS = tuple(Operator(support.op, MS, support=support) for support in (
    kernels("BiasAdd", "", "float32 float16", "CUDA only"),
    kernels("BiasSplitGelu", "", "float32 float16", "CUDA only"),
    kernels("BiasSoftmax", "", "float32 float16 float64", "CUDA only"),
    # docs/OperatorKernels.md lists float32 and float16 on CUDA, but onnxruntime-gpu 1.31.1 on an
    # H200 ran no one-node NhwcConv model (tests/test_targets.py's probe, 2026-11-29)
    kernels("NhwcConv", "", "",
            "listed for CUDA in onnxruntime's docs, but its 1.31.1 wheel ran none; no pass emits it"),
    kernels("GroupNorm", "", "float32 float16", "CUDA only; NHWC layout"),
    kernels("SkipGroupNorm", "", "float32 float16", "CUDA only; NHWC layout"),
    kernels("GemmFastGelu", "", "", "ROCm only: neither the CPU nor the CUDA provider has it"),
))
