"""LSTM (standard) and com.microsoft DynamicQuantizeLSTM (its int8-weight form, the same CPU
kernel with quantized gate products): their buffers on the CPU provider (cpu/rnn/deep_cpu_lstm.cc)."""

from __future__ import annotations

import onnx

from onnx import helper

from fuse_cli.ops.record import MS, Operator, Shapes
from fuse_cli.ops.rules import recurrent_sizes


def _gates_and_states(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The float LSTM's buffers, in bytes; 0 when unknown: per direction, the four gates of every
    step [S, B, 4H], three [B, H] states, and one more for each of Y_h and Y_c not requested (the
    kernel writes them anyway); bidirectional also reverses the input and output sequences.
    Measured on onnxruntime 1.31.1 (B 64-256, S 1-16, H 128-256, with and without initial states,
    each output alone and all three): within 0.15 [B, H] of (4 S + 3 + outputs left out) per
    direction, bidirectional within 0.2."""
    sizes = recurrent_sizes(node, shapes)
    if sizes is None:
        return 0
    steps, batch, features, hidden, directions = sizes
    outputs = list(node.output) + ["", ""]
    states = 3 + (not outputs[1]) + (not outputs[2])
    reversed_sequences = steps * batch * (features + hidden) if directions == 2 else 0
    return 4 * (directions * batch * hidden * (4 * steps + states) + reversed_sequences)


def _as_lstm(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto]:
    """DynamicQuantizeLSTM's Y: what a float LSTM of the same X and attributes writes (onnx sizes Y
    from X, hidden_size and direction; the int8 W and R, cast, only stand in their places)."""
    if len(node.input) < 3 or not node.input[0]:
        return []
    out = node.output[0]
    weights = [f"{out}::fuse-{name}-float" for name in ("w", "r")]
    casts = [helper.make_node("Cast", [name], [cast], to=onnx.TensorProto.FLOAT)
             for name, cast in zip(node.input[1:3], weights)]
    lstm = helper.make_node("LSTM", [node.input[0], *weights], [out])
    lstm.attribute.extend(a for a in node.attribute if a.name in ("hidden_size", "direction", "layout"))
    return [*casts, lstm]


RECORDS = (Operator("LSTM", workspace=_gates_and_states),
           Operator("DynamicQuantizeLSTM", MS, workspace=_gates_and_states, stand_in=_as_lstm))
