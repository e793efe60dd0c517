"""conv-bn: BatchNormalization folded into the Conv/ConvTranspose weights."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, numpy_helper

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.passes import REGISTRY
from fuse_cli.pipeline.engine import run_pipeline
from fuse_cli.verify import verify_models
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

# Pinned, so passes added to the default pipeline cannot change what these tests exercise.
PASSES = ("conv-bn",)


def conv_bn(b: GraphBuilder, x: str, op: str = "Conv", w_shape=(6, 4, 3, 3), *, w: str | None = None,
            bias: bool = True, conv_attrs=None, eps: float = 1e-5, dtype=np.float32, suffix: str = "",
            bn_attrs=None, **params: str | np.ndarray) -> tuple[str, str]:
    """x -> Conv/ConvTranspose -> BatchNormalization with random constants named w, b, gamma,
    beta, mean, var (+suffix); `params` overrides a BN parameter by value or by a tensor name.
    Returns (Conv output, BN output)."""
    conv_attrs = conv_attrs or {}
    channels = w_shape[1] * conv_attrs.get("group", 1) if op == "ConvTranspose" else w_shape[0]

    def const(name, value):
        return value if isinstance(value, str) else b.const(np.asarray(value).astype(dtype), name=name + suffix)

    inputs = [x, w or const("w", b.rand(*w_shape))] + ([const("b", b.rand(channels))] if bias else [])
    c = b.op(op, *inputs, **conv_attrs)
    bn = {"gamma": b.rand(channels, low=0.5, high=1.5), "beta": b.rand(channels), "mean": b.rand(channels),
          "var": b.rand(channels, low=0.5, high=2.0), **params}
    return c, b.op("BatchNormalization", c, *(const(k, v) for k, v in bn.items()), epsilon=eps, **(bn_attrs or {}))


def conv_bn_model(op="Conv", x_shape=(2, 4, 8, 8), w_shape=(6, 4, 3, 3), *, opset: int = 17, **kw) -> onnx.ModelProto:
    b = GraphBuilder(opset=opset)
    _, y = conv_bn(b, b.input("x", list(x_shape)), op, w_shape, **kw)
    return b.build(y, output_names=["y"])


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


CONVS = {
    "1d": ("Conv", (2, 4, 10), (6, 4, 3), {}),
    "2d": ("Conv", (2, 4, 8, 8), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3d": ("Conv", (1, 4, 5, 5, 5), (6, 4, 3, 3, 3), {"strides": [2, 2, 2]}),
    "grouped": ("Conv", (2, 4, 8, 8), (6, 2, 3, 3), {"group": 2}),
    "depthwise": ("Conv", (2, 4, 8, 8), (4, 1, 3, 3), {"group": 4}),
    "transpose": ("ConvTranspose", (2, 4, 6, 6), (4, 6, 3, 3), {"strides": [2, 2]}),
    "transpose-grouped": ("ConvTranspose", (2, 4, 6, 6), (4, 3, 3, 3), {"group": 2}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("kind", CONVS)
def test_folds_and_matches(tmp_path, kind, bias):
    op, x_shape, w_shape, attrs = CONVS[kind]
    model = conv_bn_model(op, x_shape, w_shape, bias=bias, conv_attrs=attrs)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {op: 1}
    assert len(result.model.graph.node[0].input) == 3  # a bias is created when the Conv had none
    assert_equivalent(model, result.model)
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


def test_epsilon_is_kept(tmp_path):
    # var is tiny next to eps, so a fold that dropped eps would be far outside the tolerance
    model = conv_bn_model(eps=1e-2, var=np.full(6, 1e-6))
    without_eps = copy.deepcopy(model)
    next(a for a in without_eps.graph.node[1].attribute if a.name == "epsilon").f = 0.0
    assert not verify_models(model, without_eps).passed
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Conv": 1}
    assert_equivalent(model, result.model)


def test_fp16_weights_fold_in_float64_rounded_once(tmp_path):
    eps = 1e-3
    b = GraphBuilder()
    _, y = conv_bn(b, b.input("x", [1, 4, 6, 6], TensorProto.FLOAT16), bias=False, eps=eps, dtype=np.float16)
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Conv": 1}
    p = initializers(model)
    folded = initializers(result.model)[result.model.graph.node[0].input[1]]
    scale = p["gamma"].astype(np.float64) / np.sqrt(p["var"].astype(np.float64) + float(np.float32(eps)))
    expected = (p["w"].astype(np.float64) * scale.reshape(-1, 1, 1, 1)).astype(np.float16)
    assert folded.dtype == np.float16
    np.testing.assert_array_equal(folded, expected)
    # the comparison has teeth: folding in fp16 arithmetic gives other weights
    in_fp16 = p["w"] * (p["gamma"] / np.sqrt(p["var"] + np.float16(eps))).reshape(-1, 1, 1, 1)
    assert (in_fp16 != expected).any()
    # fp16 tolerance: the unfused graph rounds the Conv output to fp16 before BN (1 ulp = 4e-3 at 4)
    assert_equivalent(model, result.model, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("second_has_bn", [True, False], ids=["both-bn", "one-bn"])
def test_shared_weight_is_not_mutated(tmp_path, second_has_bn):
    b = GraphBuilder()
    x = b.input("x", [2, 4, 8, 8])
    w = b.const(b.rand(6, 4, 3, 3), name="w")
    _, first = conv_bn(b, x, w=w, suffix="1")
    pads = {"pads": [1, 1, 1, 1]}
    second = conv_bn(b, x, w=w, suffix="2", conv_attrs=pads)[1] if second_has_bn else b.op("Conv", x, w, **pads)
    model = b.build(first, second, output_names=["y1", "y2"])

    graph = gs.import_onnx(model)
    shared = graph.tensors()["w"]
    before = shared.values.copy()
    fusions, _ = run_pipeline(GraphEditor(graph, opset=17, shapes={}, dtypes={}), [REGISTRY["conv-bn"]],
                              lambda name: None)
    assert len(fusions) == 1 + second_has_bn
    np.testing.assert_array_equal(shared.values, before)

    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Conv": 2}
    assert_equivalent(model, result.model)


def _also_read(b, x):
    c, y = conv_bn(b, x)
    return b.build(y, b.op("Relu", c, name="reader"), output_names=["y", "z"])


def _conv_is_output(b, x):
    c, y = conv_bn(b, x)
    return b.build(y, c, output_names=["y", "c"])


NEAR_MISSES = {
    "training-mode": (15, lambda b, x: b.build(conv_bn(b, x, bn_attrs={"training_mode": 1})[1]), "training mode"),
    "opset6-is-test-0": (6, lambda b, x: b.build(conv_bn(b, x)[1]), "has is_test=0"),
    "conv-output-read-elsewhere": (17, _also_read, "is also read by reader"),
    "conv-output-is-graph-output": (17, _conv_is_output, "'c' is a graph output"),
    "weight-is-input": (17, lambda b, x: b.build(conv_bn(b, x, w=b.input("w", [6, 4, 3, 3]))[1]),
                        "'w' is a graph input, not a constant"),
    "gamma-is-input": (17, lambda b, x: b.build(conv_bn(b, x, gamma=b.input("g", [6]))[1]),
                       "'g' is a graph input, not a constant"),
    "gamma-broadcast": (17, lambda b, x: b.build(conv_bn(b, x, gamma=np.ones(1))[1]),
                        "scale has shape [1], expected [6]"),
    "initializer-listed-as-input": (17, lambda b, x: b.build(conv_bn(b, x)[1], initializers_as_inputs=True),
                                    "pass --freeze-inputs"),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss(tmp_path, case):
    opset, build, reason = NEAR_MISSES[case]
    b = GraphBuilder(opset=opset)
    model = build(b, b.input("x", [2, 4, 8, 8]))
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert_declined(model, result, "conv-bn", reason)


def test_opset6_folds_in_test_mode(tmp_path):
    # onnxruntime has no BatchNormalization-6 kernel, so this is structural; the math is shared
    model = conv_bn_model(opset=6, bn_attrs={"is_test": 1})
    assert op_counts(optimize_model(model, tmp_path, passes=PASSES).model) == {"Conv": 1}


def test_freeze_inputs_folds_initializers_listed_as_inputs(tmp_path):
    b = GraphBuilder()
    model = b.build(conv_bn(b, b.input("x", [2, 4, 8, 8]))[1], output_names=["y"], initializers_as_inputs=True)
    assert len(model.graph.input) == 7
    result = optimize_model(model, tmp_path, freeze_inputs=True, passes=PASSES)
    assert op_counts(result.model) == {"Conv": 1}
    assert [i.name for i in result.model.graph.input] == ["x"]
    assert_equivalent(model, result.model)


def test_below_ir4_initializers_are_constants(tmp_path):
    b = GraphBuilder(opset=9)
    _, y = conv_bn(b, b.input("x", [2, 4, 8, 8]))
    model = b.build(b.op("Add", y, b.const(b.rand(6, 1, 1), name="shift")), output_names=["y"], ir_version=3,
                    initializers_as_inputs=True)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Conv": 1, "Add": 1}
    listed = [i.name for i in result.model.graph.input]
    assert {"x", "shift"} <= set(listed)
    assert not {"w", "b", "gamma", "beta", "mean", "var"} & set(listed)
    # IR 3 still needs every initializer listed as an input, the folded ones included
    assert sorted(listed) == sorted(["x"] + [t.name for t in result.model.graph.initializer])
    assert_equivalent(model, result.model)
