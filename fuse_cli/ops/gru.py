"""GRU (standard): its buffers on the CPU provider (cpu/rnn/deep_cpu_gru.cc)."""

from __future__ import annotations

import onnx

from fuse_cli.ops.record import Operator, Shapes
from fuse_cli.ops.rules import attributes, recurrent_sizes


def _gates_and_input(node: onnx.NodeProto, shapes: Shapes, opset: int) -> int:
    """The float GRU's buffers, in bytes; 0 when unknown: per direction the three gates of every
    step [S, B, 3H] (UniDirectionalGru's outputZRH_), and for the reverse direction (alone or the
    second of bidirectional, which runs while the forward one's buffers are still held) a reversed
    copy of the input [S, B, I] and of its output [S, B, H] (inputs_reverse_, outputs_reverse_).
    Measured on onnxruntime 1.31.1 (memray's count of the run, one node, S 64, B 64, I 128-256,
    H 128-256): forward, reverse and bidirectional within 3% of the allocator's peak above the
    input and outputs (tests/test_recurrent_memory.py); before, the estimate held a copy of the
    input per direction and none of the reverse sequences (a BiGRU tagger at 1.16, a reverse GRU
    at 0.85, a forward one at 1.18 of the allocator)."""
    sizes = recurrent_sizes(node, shapes)
    if sizes is None:
        return 0
    steps, batch, features, hidden, directions = sizes
    direction = attributes(node).get("direction", b"forward")
    reversed_sequences = steps * batch * (features + hidden) if direction in (b"reverse", "reverse") \
        or directions == 2 else 0
    return 4 * (directions * steps * batch * 3 * hidden + reversed_sequences)


RECORDS = (Operator("GRU", workspace=_gates_and_input),)
