"""Recurrent models built in code for the memory-truth benchmark (issue 34): onnxruntime's GRU and
LSTM kernels hold gate buffers and a copy of the input beside their outputs (ops/gru.py,
ops/lstm.py), which no torch export in the corpora has.

- `bigru_tagger`: a sequence tagger as paddle2onnx exports one (token ids, embedding, one
  bidirectional GRU, a linear layer over both directions); the issue's case is 1 x 64 tokens;
- `lstm_stack`: two LSTM layers, the second bidirectional, over [sequence, batch, features];
- `gru_stack`: one forward GRU with its initial state given.

Dims `batch` and `sequence` are symbolic; the weights are seeded random values.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, EMBED, HIDDEN, TAGS, FEATURES = 5000, 128, 128, 32, 64
OPSET = 14


def _weights(rng: np.random.Generator, **shapes: tuple[int, ...]) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(rng.normal(0, 0.1, shape).astype(np.float32), name)
            for name, shape in shapes.items()]


def _recurrent_weights(rng, prefix: str, gates: int, directions: int, features: int) -> list[onnx.TensorProto]:
    """W, R, B of an ONNX GRU (3 gates) or LSTM (4 gates)."""
    return _weights(rng, **{f"{prefix}_W": (directions, gates * HIDDEN, features),
                            f"{prefix}_R": (directions, gates * HIDDEN, HIDDEN),
                            f"{prefix}_B": (directions, 2 * gates * HIDDEN)})


def _model(nodes, name, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)


def bigru_tagger() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    initializers = [*_weights(rng, embedding=(VOCAB, EMBED), tag_weight=(2 * HIDDEN, TAGS), tag_bias=(TAGS,)),
                    *_recurrent_weights(rng, "gru", 3, 2, EMBED),
                    numpy_helper.from_array(np.array([0, 0, 2 * HIDDEN], np.int64), "merged_directions")]
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["embedded"]),                  # [batch, sequence, E]
        helper.make_node("Transpose", ["embedded"], ["time_major"], perm=[1, 0, 2]),     # [sequence, batch, E]
        helper.make_node("GRU", ["time_major", "gru_W", "gru_R", "gru_B"], ["states"],   # [sequence, 2, batch, H]
                         hidden_size=HIDDEN, direction="bidirectional"),
        helper.make_node("Transpose", ["states"], ["batch_major"], perm=[2, 0, 1, 3]),   # [batch, sequence, 2, H]
        helper.make_node("Reshape", ["batch_major", "merged_directions"], ["features"]),  # [batch, sequence, 2H]
        helper.make_node("MatMul", ["features", "tag_weight"], ["scores"]),
        helper.make_node("Add", ["scores", "tag_bias"], ["tags"]),
    ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])
    tags = helper.make_tensor_value_info("tags", TensorProto.FLOAT, ["batch", "sequence", TAGS])
    return _model(nodes, "bigru_tagger", [ids], [tags], initializers)


def lstm_stack() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    initializers = [*_recurrent_weights(rng, "lstm1", 4, 1, FEATURES),
                    *_recurrent_weights(rng, "lstm2", 4, 2, HIDDEN)]
    nodes = [
        helper.make_node("LSTM", ["x", "lstm1_W", "lstm1_R", "lstm1_B"], ["y1"], hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["y1", "one_axis"], ["h1"]),                         # [sequence, batch, H]
        helper.make_node("LSTM", ["h1", "lstm2_W", "lstm2_R", "lstm2_B"], ["y2", "last_h"],
                         hidden_size=HIDDEN, direction="bidirectional"),
    ]
    initializers.append(numpy_helper.from_array(np.array([1], np.int64), "one_axis"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["sequence", "batch", FEATURES])
    outputs = [helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["sequence", 2, "batch", HIDDEN]),
               helper.make_tensor_value_info("last_h", TensorProto.FLOAT, [2, "batch", HIDDEN])]
    return _model(nodes, "lstm_stack", [x], outputs, initializers)


def gru_stack() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    initializers = _recurrent_weights(rng, "gru", 3, 1, FEATURES)
    nodes = [helper.make_node("GRU", ["x", "gru_W", "gru_R", "gru_B", "", "h0"], ["y", "last_h"],
                              hidden_size=HIDDEN, linear_before_reset=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["sequence", "batch", FEATURES])
    h0 = helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, "batch", HIDDEN])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["sequence", 1, "batch", HIDDEN]),
               helper.make_tensor_value_info("last_h", TensorProto.FLOAT, [1, "batch", HIDDEN])]
    return _model(nodes, "gru_stack", [x, h0], outputs, initializers)


# name -> (builder, the small setting's dims, integer input ranges)
RECURRENT = {
    "bigru-tagger": (bigru_tagger, {"batch": 1, "sequence": 64}, {"ids": (0, VOCAB)}),
    "lstm-stack": (lstm_stack, {"batch": 1, "sequence": 64}, {}),
    "gru-stack": (gru_stack, {"batch": 1, "sequence": 64}, {}),
}
