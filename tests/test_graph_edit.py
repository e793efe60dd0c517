"""GraphEditor's small services that every pass relies on."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from fuse_cli.graph.edit import GraphEditor


@pytest.mark.parametrize("value", [np.float32(0.5), np.array(3, np.int64), np.zeros((2, 3), np.float16),
                                   np.arange(6, dtype=np.float32).reshape(2, 3).T],
                         ids=["scalar", "0-d array", "matrix", "non-contiguous"])
def test_a_constant_keeps_its_rank_dtype_and_values(value):
    """np.ascontiguousarray alone makes a 0-d value 1-D: a folded scalar would gain a rank."""
    g = GraphEditor(gs.Graph(), opset=17, shapes={}, dtypes={})
    made = g.constant("c", value).values
    assert made.shape == np.shape(value) and made.dtype == np.asarray(value).dtype
    assert np.array_equal(made, value) and made.flags["C_CONTIGUOUS"]


def test_the_node_builder_names_wires_and_records_each_node():
    """b.op.X(...) builds a node named after the base (unique in the model), returns its new output to
    wire into the next call, and writes the tensors it is given (a matched root's) as they are."""
    x = gs.Variable("x", dtype=np.float32, shape=[2])
    root_out = gs.Variable("y", dtype=np.float32, shape=[2])
    taken = gs.Node("Relu", "fused_mul", inputs=[x], outputs=[gs.Variable("fused_mul_out")])
    g = GraphEditor(gs.Graph(nodes=[taken], inputs=[x], outputs=[root_out]), opset=17, shapes={}, dtypes={})
    b = g.builder("fused")
    scaled = b.op.Mul(x, g.constant("two", np.float32(2)))
    out = b.op.Clip(scaled, gs.Variable.empty(), gs.Variable.empty(), _outputs=[root_out], _name="fused_clip")
    mul, clip = b.nodes
    assert mul.name == "fused_mul_1" and scaled is mul.outputs[0] and scaled.name not in ("fused_mul_out", "")
    assert clip.inputs == [scaled] and out is root_out and clip.outputs == [root_out]  # trailing omitted inputs go
    ms = g.node("Gelu", [x], {"approximate": "tanh"}, name="fused_clip", domain="com.microsoft")
    assert ms.name == "fused_clip_1" and ms.domain == "com.microsoft" and ms.attrs == {"approximate": "tanh"}
    assert len(ms.outputs) == 1 and ms.outputs[0].name == "fused_clip_1_out"
