"""com.microsoft FusedConv: Conv, an optional residual Z added, then an activation (fused-conv)."""

from __future__ import annotations

import onnx
from onnx import helper

from fuse_cli.ops.conv import conv_workspace
from fuse_cli.ops.record import FLOAT_ONLY, MS, Contract, Input, Operator, Slower, Spec, kernels
from fuse_cli.ops.rules import attributes

_CONV_ATTRIBUTES = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})


def _as_conv(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    kept = {k: v for k, v in attributes(node).items() if k in _CONV_ATTRIBUTES}
    return [helper.make_node("Conv", node.input[:3], node.output[:1], **kept)]


RECORDS = (Operator(
    "FusedConv", MS,
    support=kernels("FusedConv", "float32", "float32",
                    "activation: CPU takes Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid; "
                    "CUDA only Relu (recent builds also Tanh)"),
    slower=(Slower(
        "FusedConv", "cuda",
        "onnxruntime-gpu 1.31's CUDA FusedConv measured 1.8-2.5x slower than the Conv and activation it replaces "
        "(resnet50, inception_v2 on an H200) (target {target}); --target ort-cpu fuses it",
        "NVIDIA H200, onnxruntime-gpu 1.31.1, batch 1 (fuse bench --provider CUDA, against the same model with "
        "its BatchNormalizations folded): light_resnet50 1.87x at graph optimization disabled and 2.08x at all; "
        "light_inception_v2 1.79x and 2.47x. The same folds without FusedConv (--target onnx) ran 0.92x and 0.70x."),),
    probe=Spec("FusedConv", MS, (Input("X", (2, 3, 5, 5)), Input("W", (4, 3, 3, 3)), Input("B", (4,), True),
                                 Input("Z", (2, 4, 5, 5), True)), {"activation": "Relu", "pads": [1, 1, 1, 1]}),
    contracts=tuple(Contract("FusedConv", MS, "float32", absent, ("fused-conv",))
                    for absent in ((), ("B",), ("Z",), ("B", "Z"))),
    stand_in=_as_conv,
    workspace=conv_workspace,
    in_place=(3, FLOAT_ONLY),  # the residual Z, summed into the output
),)
