"""DequantizeLinear -> Reshape | Transpose | ... -> QuantizeLinear at one scale: the node moves the
quantized values themselves."""

from __future__ import annotations

import numpy as np

from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Match, Op, Var, constant_value
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.quantized import QUANTIZE, dequantized, shared_dequantizers

# Nodes that only select, copy or rearrange elements of input 0 (their other inputs are shapes,
# indices, axes), each with onnxruntime CPU kernels for every type: they commute with quantization.
MOVES = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Slice", "Gather", "Tile")


@register
class DropQdqPairAroundMove(PatternPass):
    """A node that moves elements between a DequantizeLinear and a QuantizeLinear of the same
    scale and zero point runs on the quantized values:

        x_q ── DQ(s, z) ── Reshape | Transpose | Squeeze | Unsqueeze | ... ── Q(s, z) ── y_q
          =>  x_q ── Reshape | Transpose | Squeeze | Unsqueeze | ... ── y_q

    Exact: Q(DQ(v)) = round((v - z) * s / s) + z = v for every quantized v (the float error of
    (v - z) * s / s is far below half a step), and a node that only moves elements moves v
    as it moves DQ(v). onnxruntime drops the same pairs at ORT_ENABLE_EXTENDED (its DropQDQ
    selectors); dropped here, the quantized values move at every level, as bytes rather than
    floats, and the nodes on either side read each other's quantized values (a QLinearMatMul
    after a Transpose then takes the Transpose's output). A DequantizeLinear another node reads
    too stays for that reader.
    """

    name = "drop-qdq-pairs"
    description = "Drop a DequantizeLinear/QuantizeLinear pair of one scale around Reshape, Transpose and other moves"
    label = "DQ + Reshape | Transpose | ... + Q -> Reshape | Transpose | ..."
    min_opset = 10
    keeps = ("x_dq",)
    pattern = Op(QUANTIZE, Op(MOVES, dequantized("x"), *(Var(f"in{i}", optional=True) for i in range(1, 5)),
                              name="move"),
                 Var("y_scale", const=True), Var("y_zero", const=True, optional=True), name="q")

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        move, dq, q = m.node("move"), m.node("x_dq"), m.node("q")
        if len(move.outputs) != 1:
            return Decline(f"{move.name} has {len(move.outputs)} outputs")
        if dq.attrs.get("block_size", 0):
            return Decline(f"{dq.name} is blockwise")
        scales = [constant_value(m.tensor(f"{n}_scale")) for n in ("x", "y")]
        zeros = [_zero(m, g, n) for n in ("x", "y")]
        if any(v.size != 1 for v in (*scales, *zeros)):
            return Decline(f"{move.name}: {dq.name} or {q.name} quantizes per axis; "
                           "the pair is dropped per tensor only")
        if zeros[0].dtype != zeros[1].dtype:
            return Decline(f"{q.name} quantizes to {zeros[1].dtype}, {dq.name} reads {zeros[0].dtype}")
        if scales[0].reshape(-1)[0] != scales[1].reshape(-1)[0] or zeros[0].reshape(-1)[0] != zeros[1].reshape(-1)[0]:
            return Decline(f"{move.name}: {q.name} requantizes to another scale or zero point than {dq.name}'s "
                           "(the pair is a requantization, not a no-op)")
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        move = m.node("move")
        moved = rebuilt(move, inputs=[m.tensor("x_q"), *move.inputs[1:]], outputs=[m.root.outputs[0]])
        return Replacement(nodes=[*shared_dequantizers(m, g), moved])


def _zero(m: Match, g: GraphEditor, name: str) -> np.ndarray:
    """The zero point's value; absent, the zero of the quantized type (uint8 for a Q without one)."""
    value = constant_value(m.tensor(f"{name}_zero"))
    if value is not None:
        return value
    return np.zeros((), g.dtype(m.tensor("x_q")) if name == "x" else np.uint8)
