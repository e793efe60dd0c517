"""Shape arithmetic evaluated at bound dims (analysis/shape_values.py): the values are onnxruntime's,
and the tensors they shape get sizes where onnx's data propagation left them unknown."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.shape_values import evaluate_shape_values, initial_values
from fuse_cli.analysis.shapes import infer_shapes

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def untyped(name):
    """A graph output whose type inference decides (onnxruntime too)."""
    return onnx.ValueInfoProto(name=name)


def const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype), name)


def window_pad_model(window: int = 7):
    """timm Swin's window partition: pad H and W of x[N, H, W, C] up to whole windows by
    (window - H % window) % window, then Reshape into windows. onnx's data propagation has no
    rule for Mod, so without evaluation the Pad and Reshape outputs have no shape."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shape"]),
        n("Gather", ["shape", "one"], ["h"], axis=0),
        n("Gather", ["shape", "two"], ["w"], axis=0),
        n("Mod", ["h", "win"], ["h_mod"]), n("Sub", ["win", "h_mod"], ["h_left"]),
        n("Mod", ["h_left", "win"], ["pad_h"]),
        n("Mod", ["w", "win"], ["w_mod"]), n("Sub", ["win", "w_mod"], ["w_left"]),
        n("Mod", ["w_left", "win"], ["pad_w"]),
        n("Unsqueeze", ["pad_h", "axis0"], ["pad_h1"]), n("Unsqueeze", ["pad_w", "axis0"], ["pad_w1"]),
        # laid out so that Reshape [2, 4] -> Transpose -> flatten gives [0, 0, 0, 0, 0, pad_h, pad_w, 0]
        n("Concat", ["zeros3", "pad_w1", "zeros2", "pad_h1", "zero1"], ["pads_t"], axis=0),
        n("Reshape", ["pads_t", "pads_shape"], ["pads_2x4"]),
        n("Transpose", ["pads_2x4"], ["pads_4x2"], perm=[1, 0]),
        n("Reshape", ["pads_4x2", "minus1"], ["pads"]),
        n("Pad", ["x", "pads"], ["padded"]),
        n("Shape", ["padded"], ["padded_shape"]),
        n("Slice", ["padded_shape", "s1", "s3"], ["hw"]),
        n("Div", ["hw", "win"], ["windows"]),
        n("Concat", ["minus1", "windows", "win1", "c"], ["window_shape"], axis=0),
        n("Reshape", ["padded", "window_shape"], ["y"]),
        n("Relu", ["y"], ["out"]),
    ]
    inits = [const("one", 1), const("two", 2), const("win", window), const("axis0", [0]),
             const("zeros3", [0, 0, 0]), const("zeros2", [0, 0]), const("zero1", [0]), const("pads_shape", [2, 4]),
             const("minus1", [-1]), const("s1", [1]), const("s3", [3]), const("win1", [window * window]),
             const("c", [8])]
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", FLOAT, ["N", "H", "W", 8])],
                              [untyped("out"), untyped("pads"), untyped("window_shape")], inits)
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("n", "h", "w"), [(1, 56, 56), (3, 5, 11), (2, 14, 9)])
def test_window_partition_gets_sizes_and_onnxruntimes_values(n, h, w):
    model = window_pad_model()
    table = infer_shapes(model, input_shapes={"x": [n, h, w, 8]})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out, pads, window_shape = session.run(None, {"x": np.zeros((n, h, w, 8), np.float32)})
    assert table.get("y").shape == out.shape
    assert table.get("out").shape == out.shape
    assert pads.tolist() == [0, 0, 0, 0, 0, (7 - h % 7) % 7, (7 - w % 7) % 7, 0]
    assert table.get("padded").shape == (n, h + int(pads[5]), w + int(pads[6]), 8)
    assert table.get("y").shape == (n, *window_shape.tolist()[1:])
    assert not table.unknown_dims


def test_without_bound_dims_the_computed_shapes_stay_unknown():
    table = infer_shapes(window_pad_model())
    assert table.get("y").shape is None or None in table.get("y").shape


def test_a_value_read_from_data_is_never_evaluated():
    """Pads taken from an input's values, not its shape: unknown before the run, so no size."""
    nodes = [helper.make_node("Cast", ["p"], ["pads"], to=INT64), helper.make_node("Pad", ["x", "pads"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2, 3]),
                                           helper.make_tensor_value_info("p", FLOAT, [4])],
                              [helper.make_tensor_value_info("y", FLOAT, None)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])
    info = infer_shapes(model).get("y")
    assert info.shape is None or None in info.shape


ARITHMETIC = [
    # (op, inputs, attrs): each evaluated and compared with onnxruntime's output
    ("Div", [np.array([-7, 7, -7, 9], np.int64), np.array([2, -2, -2, 3], np.int64)], {}),
    ("Mod", [np.array([-7, 7, -7, 9], np.int64), np.array([2, -2, 3, 4], np.int64)], {}),
    ("Mod", [np.array([-7, 7, -7, 9], np.int64), np.array([2, -2, 3, 4], np.int64)], {"fmod": 1}),
    ("Slice", [np.arange(10, dtype=np.int64), np.array([-3]), np.array([-100]), np.array([0]), np.array([-2])], {}),
    ("Slice", [np.arange(10, dtype=np.int64), np.array([2]), np.array([2**62]), np.array([0]), np.array([3])], {}),
    ("Range", [np.array(10, np.int64), np.array(-3, np.int64), np.array(-4, np.int64)], {}),
    ("Where", [np.array([True, False, True]), np.array([1, 2, 3], np.int64), np.array([7, 8, 9], np.int64)], {}),
    ("Max", [np.array([1, 5, 3], np.int64), np.array([4, 2, 6], np.int64)], {}),
    ("Gather", [np.array([4, 5, 6, 7], np.int64), np.array([-1, 0], np.int64)], {"axis": 0}),
    ("Squeeze", [np.array([[3]], np.int64), np.array([0, 1])], {}),
    ("Unsqueeze", [np.array([3, 4], np.int64), np.array([-1, 0])], {}),
    ("Reshape", [np.arange(6, dtype=np.int64).reshape(2, 3), np.array([0, -1])], {}),
    ("Transpose", [np.arange(6, dtype=np.int64).reshape(2, 3)], {"perm": [1, 0]}),
    ("ConstantOfShape", [np.array([2, 3], np.int64)], {"value": numpy_helper.from_array(np.array([5], np.int64))}),
    ("Expand", [np.array([[1], [2]], np.int64), np.array([2, 3], np.int64)], {}),
    ("ReduceProd", [np.array([[2, 3], [4, 5]], np.int64), np.array([1])], {"keepdims": 0}),
    ("Cast", [np.array([2.7, -2.7], np.float32)], {"to": INT64}),
    ("Equal", [np.array([1, 2], np.int64), np.array([1, 3], np.int64)], {}),
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), ARITHMETIC, ids=[f"{a[0]}-{i}" for i, a in enumerate(ARITHMETIC)])
def test_each_rule_computes_what_onnxruntime_computes(op, inputs, attrs):
    names = [f"in{i}" for i in range(len(inputs))]
    opset = 18
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [], [untyped("y")],
                              [numpy_helper.from_array(v, n) for v, n in zip(inputs, names)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})[0]
    values = initial_values(list(graph.initializer))
    assert evaluate_shape_values(list(graph.node), lambda name: None, opset, values) == 1
    np.testing.assert_array_equal(values["y"], expected)
    assert values["y"].dtype == expected.dtype


def test_split_into_named_parts():
    n = helper.make_node
    graph = helper.make_graph([n("Split", ["v", "sizes"], ["a", "b"], axis=0)], "g", [],
                              [helper.make_tensor_value_info(x, INT64, None) for x in "ab"],
                              [const("v", [1, 2, 3, 4, 5]), const("sizes", [2, 3])])
    values = initial_values(list(graph.initializer))
    assert evaluate_shape_values(list(graph.node), lambda name: None, 18, values) == 2
    assert values["a"].tolist() == [1, 2] and values["b"].tolist() == [3, 4, 5]


def test_large_values_are_left_alone():
    """Only shape-sized values: a Range of 10k elements is an activation, not a shape."""
    n = helper.make_node
    graph = helper.make_graph([n("Range", ["a", "b", "c"], ["r"])], "g", [],
                              [helper.make_tensor_value_info("r", INT64, None)],
                              [const("a", 0), const("b", 10_000), const("c", 1)])
    values = initial_values(list(graph.initializer))
    assert evaluate_shape_values(list(graph.node), lambda name: None, 18, values) == 0
