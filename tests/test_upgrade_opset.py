"""--upgrade-opset keeps the shapes the model declared, as it declared them: onnx's version
converter re-infers every shape and writes its own placeholders (unk__N) over the model's, which
fuse would then read as symbols of the model and grow one by one at the peak guard's larger
setting."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.graph.opset import upgrade_opset


def _declared(model: onnx.ModelProto) -> dict[str, list]:
    return {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in model.graph.value_info}


def _model_with_a_computed_expand():
    """An Expand to a shape computed from the input, declared by the exporter with four dims it
    does not name (dynamo's form): onnx's inference names them unk__N."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Max", ["shape", "ones"], ["wide"]),
        helper.make_node("Expand", ["x", "wide"], ["expanded"]),
        helper.make_node("Relu", ["expanded"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 1, "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(4, np.int64), "ones")],
        value_info=[helper.make_tensor_value_info("expanded", TensorProto.FLOAT, [None, None, None, None])])
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 18)])


def test_the_declared_shapes_stay_as_declared():
    model = _model_with_a_computed_expand()
    upgraded = upgrade_opset(model, 23)
    assert _declared(upgraded) == {"expanded": [0, 0, 0, 0]}  # four dims, none named: as declared
    assert not any(str(d).startswith("unk__") for dims in _declared(upgraded).values() for d in dims)


def test_a_declaration_of_a_tensor_the_converter_removed_goes():
    model = _model_with_a_computed_expand()
    model.graph.value_info.append(helper.make_tensor_value_info("gone", TensorProto.FLOAT, ["batch"]))
    assert "gone" not in _declared(upgrade_opset(model, 23))
