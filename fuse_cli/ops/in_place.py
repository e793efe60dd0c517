"""Standard kernels that may compute their output in their input's buffer (KernelDef MayInplace):
the activations of cpu/activation/activations.cc, Clip, Softmax and LogSoftmax on float, Cast,
Trilu, ScatterElements. Add, Sub, Mul, Div, Pow, Neg, Exp, Erf, Sqrt and Gelu declare no in-place
on the CPU provider: measured, they always take another buffer."""

from __future__ import annotations

from fuse_cli.ops.record import FLOAT_ONLY, Operator

RECORDS = (
    *(Operator(op, in_place=(0, None)) for op in (
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "HardSigmoid",
        "Softplus", "Softsign", "ThresholdedRelu", "Clip", "Cast", "Trilu", "ScatterElements",
    )),
    Operator("Softmax", in_place=(0, FLOAT_ONLY)),
    Operator("LogSoftmax", in_place=(0, FLOAT_ONLY)),
)
