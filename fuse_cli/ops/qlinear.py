"""The standard QLinearConv and QLinearMatMul (opset 10): QDQ node units formed by qlinear-conv and
qlinear-matmul."""

from __future__ import annotations

import onnx

from fuse_cli.ops.record import Contract, Input, Operator, Shapes, Spec, kernels, scalar

# The dtype a row speaks of is the activation's (x, a), which is also the output's. Probed with
# one-node sessions at graph optimization disabled, onnxruntime-gpu 1.31.1's CPU provider: u8 x
# with u8 or s8 w into u8, s8 x with s8 w into s8; every other combination is NOT_IMPLEMENTED.
_TYPES = ("u8 x with u8 or s8 weights (output u8), s8 x with s8 weights (output s8); a per-tensor x, y; "
          "onnxruntime forms it itself at ORT_ENABLE_EXTENDED from the unit")


def _quantized(name: str, shape: tuple[int, ...], dtype: str) -> Input:
    """Values over the whole range of `dtype`; a zero point (shape ()) of 0."""
    low = -128 if dtype == "int8" else 0
    return Input(name, shape, integers=(low, low + 256) if shape else (0, 1), integer_dtype=dtype)


def _int32_products(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """onnxruntime's CPU QLinearMatMul sums every product in an int32 buffer of the output's shape
    (M x N per matrix, every matrix of the batch at once: qlinearmatmul.cc's gemm_output_buffer),
    then requantizes it into the 8-bit output: 4 bytes per output element while it runs. Measured
    unmodelled on a QDQ ViT layer at batch 1024 x 17 tokens: estimate 0.826 of the allocator."""
    return 4 * (shapes.nbytes(node.output[0]) or 0)


RECORDS = (
    Operator(
        "QLinearConv",
        support=kernels("QLinearConv", "uint8 int8", "", _TYPES, domain=""),
        standard=True,
        probe=Spec("QLinearConv", "", (
            _quantized("x", (1, 2, 5, 5), "uint8"), scalar("x_scale", 1), _quantized("x_zero_point", (), "uint8"),
            _quantized("w", (3, 2, 3, 3), "int8"), scalar("w_scale", 1), _quantized("w_zero_point", (), "int8"),
            scalar("y_scale", 2048), _quantized("y_zero_point", (), "uint8"),
            Input("B", (3,), True, integers=(-4096, 4096), integer_dtype="int32")), {"pads": [1, 1, 1, 1]}, opset=13),
        contracts=(Contract("QLinearConv", "", "uint8", (), ("qlinear-conv",)),
                   Contract("QLinearConv", "", "uint8", ("B",), ("qlinear-conv",))),
    ),
    Operator(
        "QLinearMatMul",
        support=kernels("QLinearMatMul", "uint8 int8", "", _TYPES.replace(" x", " a").replace("x,", "a,"),
                        domain=""),
        standard=True,
        probe=Spec("QLinearMatMul", "", (
            _quantized("a", (2, 3, 8), "uint8"), scalar("a_scale", 1), _quantized("a_zero_point", (), "uint8"),
            _quantized("b", (8, 4), "int8"), scalar("b_scale", 1), _quantized("b_zero_point", (), "int8"),
            scalar("y_scale", 2048), _quantized("y_zero_point", (), "uint8")), opset=13),
        contracts=(Contract("QLinearMatMul", "", "uint8", (), ("qlinear-matmul",)),),
        workspace=_int32_products,
    ),
)
