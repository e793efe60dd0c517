"""conv-mul / conv-add: a per-channel constant Mul or Add after Conv/ConvTranspose folds into it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

CONVS = {  # op, x shape, weight shape, attributes; all give 6 output channels
    "1d": ("Conv", ["batch", 4, 10], (6, 4, 3), {}),
    "2d": ("Conv", ["batch", 4, 8, 8], (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3d": ("Conv", ["batch", 4, 5, 5, 5], (6, 4, 3, 3, 3), {}),
    "grouped": ("Conv", ["batch", 4, 8, 8], (6, 2, 3, 3), {"group": 2}),
    "transpose-grouped": ("ConvTranspose", ["batch", 4, 6, 6], (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
}


def conv_then(op_type: str, kind: str, const_shape, *, bias: bool = True, const_first: bool = False,
              opset: int = 17, dtype=np.float32, reader: bool = False, operand=None) -> onnx.ModelProto:
    conv_op, x_shape, w_shape, attrs = CONVS[kind]
    b = GraphBuilder(opset=opset)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", x_shape, elem)
    inputs = [x, b.const(b.rand(*w_shape, dtype=dtype), name="w")]
    if bias:
        inputs.append(b.const(b.rand(6, dtype=dtype), name="b"))
    c = b.op(conv_op, *inputs, name="conv", **attrs)
    k = operand or b.const(b.rand(*const_shape, low=0.5, high=1.5, dtype=dtype), name="k")
    y = b.op(op_type, *((k, c) if const_first else (c, k)), name="op")
    outputs = [y] + ([b.op("Relu", c, name="reader")] if reader else [])
    return b.build(*outputs, output_names=["y", "z"][:len(outputs)])


CHANNEL_SHAPES = {"scalar": (), "one": (1,), "C11": (6, 1, 1), "1C11": (1, 6, 1, 1), "1111": (1, 1, 1, 1)}


@pytest.mark.parametrize("op_type,pass_name", [("Mul", "conv-mul"), ("Add", "conv-add"), ("Div", "conv-mul")])
@pytest.mark.parametrize("const_first", [False, True], ids=["conv-first", "const-first"])
@pytest.mark.parametrize("shape", CHANNEL_SHAPES)
def test_2d_channel_constant_folds(tmp_path, op_type, pass_name, const_first, shape):
    model = conv_then(op_type, "2d", CHANNEL_SHAPES[shape], const_first=const_first)
    result = optimize_model(model, tmp_path, passes=(pass_name,))
    if op_type == "Div" and const_first:  # c / Conv(x) is not affine in x
        assert not result.report.fusions
        return
    assert op_counts(result.model) == {"Conv": 1}
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=(pass_name,)).report.fusions


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("op_type,pass_name", [("Mul", "conv-mul"), ("Add", "conv-add")])
@pytest.mark.parametrize("kind", CONVS)
def test_every_conv_kind_folds(tmp_path, kind, op_type, pass_name, bias):
    rank = len(CONVS[kind][1])
    model = conv_then(op_type, kind, (6,) + (1,) * (rank - 2), bias=bias)
    result = optimize_model(model, tmp_path, passes=(pass_name,))
    assert op_counts(result.model) == {CONVS[kind][0]: 1}
    # Add creates a bias when there was none; Mul leaves a bias-free Conv without one
    assert len(result.model.graph.node[0].input) == (3 if bias or op_type == "Add" else 2)
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})


@pytest.mark.parametrize("chain", [("Mul", "Add"), ("Add", "Div")])
def test_chain_folds_in_the_default_pipeline(tmp_path, chain):
    b = GraphBuilder()
    y = b.op("Conv", b.input("x", ["batch", 4, 8, 8]), b.const(b.rand(6, 4, 3, 3)))
    for op_type in chain:
        y = b.op(op_type, y, b.const(b.rand(6, 1, 1, low=0.5, high=1.5)))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path)
    assert op_counts(result.model) == {"Conv": 1}
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_fp16_folds_in_float64_rounded_once(tmp_path):
    model = conv_then("Mul", "2d", (6, 1, 1), dtype=np.float16)
    result = optimize_model(model, tmp_path, passes=("conv-mul",))
    assert op_counts(result.model) == {"Conv": 1}
    p = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    folded = numpy_helper.to_array(next(t for t in result.model.graph.initializer
                                        if t.name == result.model.graph.node[0].input[1]))
    expected = (p["w"].astype(np.float64) * p["k"].astype(np.float64).reshape(6, 1, 1, 1)).astype(np.float16)
    assert folded.dtype == np.float16
    np.testing.assert_array_equal(folded, expected)
    # fp16: the unfused graph rounds the Conv output to fp16 before the Mul (1 ulp = 4e-3 at 4)
    assert_equivalent(model, result.model, dims={"batch": 2}, rtol=1e-2, atol=1e-2)


def _shared_weight(b: GraphBuilder):
    x = b.input("x", [2, 4, 8, 8])
    w = b.const(b.rand(6, 4, 3, 3), name="w")
    y1 = b.op("Mul", b.op("Conv", x, w), b.const(b.rand(6, 1, 1), name="k"))
    return b.build(y1, b.op("Conv", x, w), output_names=["y1", "y2"])


def test_shared_weight_is_not_mutated(tmp_path):
    model = _shared_weight(GraphBuilder())
    result = optimize_model(model, tmp_path, passes=("conv-mul",))
    assert op_counts(result.model) == {"Conv": 2}
    weights = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    np.testing.assert_array_equal(weights["w"], numpy_helper.to_array(model.graph.initializer[0]))
    assert_equivalent(model, result.model)


NEAR_MISSES = {  # op, conv kind, build overrides, reason
    "spatial-constant": ("Mul", "2d", {"const_shape": (6, 8, 8)}, "does not broadcast over the channel axis alone"),
    "last-axis-vector": ("Add", "2d", {"const_shape": (8,)}, "constant of shape [8] does not broadcast"),
    "grows-rank": ("Mul", "2d", {"const_shape": (1, 1, 6, 1, 1)}, "does not broadcast over the channel axis alone"),
    "batch-axis": ("Add", "2d", {"const_shape": (2, 6, 1, 1)}, "does not broadcast over the channel axis alone"),
    "conv-output-read-elsewhere": ("Add", "2d", {"const_shape": (6, 1, 1), "reader": True}, "is also read by reader"),
    "div-by-zero": ("Div", "2d", {"operand": "zero"}, "divides by a constant that holds 0"),
}


def test_a_computed_operand_is_not_this_pattern(tmp_path):
    """Conv + Add of a tensor computed at run time (a residual connection) or fed by the caller is
    not a near-miss of a per-channel fold: nothing fuses and nothing is reported."""
    model = conv_then("Mul", "2d", (), operand="k_in")
    model.graph.input.append(onnx.helper.make_tensor_value_info("k_in", TensorProto.FLOAT, [6, 1, 1]))
    result = optimize_model(model, tmp_path, passes=("conv-mul",))
    assert not result.report.fusions and not result.report.near_misses


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss(tmp_path, case):
    op_type, kind, kw, reason = NEAR_MISSES[case]
    kw = dict(kw)
    const_shape = kw.pop("const_shape", ())
    if kw.get("operand") == "zero":
        kw["operand"] = "zero_k"
    model = conv_then(op_type, kind, const_shape, **kw)
    if kw.get("operand") == "zero_k":
        zero = np.array([1, 0, 1, 1, 1, 1], np.float32).reshape(6, 1, 1)
        model.graph.initializer.append(numpy_helper.from_array(zero, "zero_k"))
    if kw.get("operand"):
        model.graph.input.append(onnx.helper.make_tensor_value_info("k_in", TensorProto.FLOAT, [6, 1, 1]))
    pass_name = {"Mul": "conv-mul", "Div": "conv-mul", "Add": "conv-add"}[op_type]
    result = optimize_model(model, tmp_path, passes=(pass_name,))
    assert not result.report.fusions
    assert [(n.op_type, list(n.input)) for n in result.model.graph.node] == \
        [(n.op_type, list(n.input)) for n in model.graph.node]
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == pass_name]
    assert reason in miss


@pytest.mark.parametrize("value, dtype", [(4000.0, np.float16), (np.inf, np.float32)], ids=["fp16-range", "inf"])
def test_a_fold_out_of_range_is_declined(tmp_path, value, dtype):
    """A float16 weight of 20 times 4000 leaves float16's range (Conv(x) * 4000 need not: x is
    small); c = inf would make NaN of the zero weight, where Conv(x) * inf is +-inf."""
    b = GraphBuilder()
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", ["batch", 1, 4], elem)
    weight = np.array([20.0, 0.0, 1.0], dtype).reshape(1, 1, 3)
    y = b.op("Conv", x, b.const(weight, name="w"), name="conv")
    model = b.build(b.op("Mul", y, b.const(np.array(value, dtype), name="k"), name="op"), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("conv-mul",))
    assert_declined(model, result, "conv-mul", "is not finite")
