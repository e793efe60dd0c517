"""Structure a declarative pattern cannot say: "this slot holds a weight, not an activation"."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.match import constant_value

# eliminate-common-subexpressions compares constants up to this size by value (exporters write the
# same axes or index tensor once per use); larger ones only by identity, so no weight is read to be
# compared; merge-equal-weights makes equal weights one tensor, by sample first, for that reason.
VALUE_KEY_BYTES = 4096


def computed_at_run_time(tensor: gs.Tensor | None) -> bool:
    """Is the tensor an activation, produced by a node other than Constant? A pattern's weight
    slot holding one is not that pattern (MatMul(q, k^T) is no Linear layer, a residual Add no
    bias), so `matches()` is silent on it; a graph input or initializer in that slot still
    matches, and the engine reports it as a near-miss with the --freeze-inputs hint."""
    return isinstance(tensor, gs.Variable) and bool(tensor.inputs) and constant_value(tensor) is None
