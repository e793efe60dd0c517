"""com.microsoft FusedGemm: Gemm then an activation (fused-gemm)."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.record import MS, Contract, Input, Operator, Spec, kernels
from fuse_cli.ops.rules import attributes


def _as_gemm(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    attrs = attributes(node)
    return [helper.make_node("Gemm", node.input[:3], node.output[:1],
                             transA=attrs.get("transA", 0), transB=attrs.get("transB", 0))]


RECORDS = (Operator(
    "FusedGemm", MS,
    support=kernels("FusedGemm", "float32", "", "no CUDA kernel"),
    probe=Spec("FusedGemm", MS, (Input("A", (3, 4)), Input("B", (4, 5)), Input("C", (5,), True)),
               {"activation": "Relu"}),
    contracts=(Contract("FusedGemm", MS, "float32", (), ("fused-gemm",)),
               Contract("FusedGemm", MS, "float32", ("C",), ("fused-gemm",))),
    stand_in=_as_gemm,
),)
