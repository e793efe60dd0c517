"""GRU (standard): its buffers on the CPU provider (cpu/rnn/deep_cpu_gru.cc)."""

from __future__ import annotations

import onnx

from fuse_cli.ops.record import Operator, Shapes
from fuse_cli.ops.rules import recurrent_sizes


def _gates_and_input(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The float GRU's buffers, in bytes; 0 when unknown: per direction the three gates of every
    step [S, B, 3H] and a copy of the input sequence [S, B, I]; bidirectional also reverses the
    input and output sequences. Measured on onnxruntime 1.31.1 (memray's count of the run, one
    node, forward, Y and Y_h, S 4-32, B 16-128, I 32-256, H 64-256): within 8% of the measured
    peak above the outputs from 1 MiB up (smaller runs: 10-80%, the allocator's own sizes), and 3%
    bidirectional; before, the estimate held the outputs alone (a BiGRU tagger: 0.30 of the peak)."""
    sizes = recurrent_sizes(node, shapes)
    if sizes is None:
        return 0
    steps, batch, features, hidden, directions = sizes
    reversed_sequences = steps * batch * (features + hidden) if directions == 2 else 0
    return 4 * (directions * steps * batch * (3 * hidden + features) + reversed_sequences)


RECORDS = (Operator("GRU", workspace=_gates_and_input),)
