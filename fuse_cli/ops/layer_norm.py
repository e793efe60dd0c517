"""LayerNormalization: standard from opset 17; below it onnxruntime registers one in the default
domain (internal), which onnx has no inference for (layer-norm emits it there)."""

from __future__ import annotations

import onnx

from fuse_cli.ops.record import Operator
from fuse_cli.ops.rules import same_as_input_0


def _before_opset_17(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    return same_as_input_0(node, opset) if opset < 17 else []


RECORDS = (Operator("LayerNormalization", stand_in=_before_opset_17),)
