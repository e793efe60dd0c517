"""HardSwish and Mish (standard): the CPU provider has no kernel for them and runs their ONNX
function bodies (HardSigmoid then Mul; Softplus, Tanh, Mul), which hold one intermediate of the
output's size: measured on onnxruntime 1.31.1, [16, 256, 256] float: input + output + 4 MiB
(tests/test_analysis_measure.py). The inlined body's nodes come after every stored node in
onnxruntime's numbering, which moves them in its execution order (tests/test_memory_order.py)."""

from __future__ import annotations

from fuse_cli.ops.record import Operator
from fuse_cli.ops.rules import output_sized

RECORDS = tuple(Operator(op, workspace=output_sized, function_body=True) for op in ("HardSwish", "Mish"))
