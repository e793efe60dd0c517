"""fused-conv: Conv (+ residual Add) + activation -> com.microsoft FusedConv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for, resolve
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

PASSES = ("fused-conv",)
FLT_MAX = float(np.finfo(np.float32).max)


def conv(b: GraphBuilder, x: str, c_in: int = 3, c_out: int = 4, kernel=(3, 3), bias: bool = True,
         dtype=np.float32, **attrs) -> str:
    weights = [b.const(b.rand(c_out, c_in // attrs.get("group", 1), *kernel, dtype=dtype))]
    return b.op("Conv", x, *weights, *([b.const(b.rand(c_out, dtype=dtype))] if bias else []), **attrs)


def fused_node(model):
    (node,) = [n for n in model.graph.node if n.op_type == "FusedConv"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return node, {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}


def run(model, tmp_path, target="ort-cpu", name="model"):
    return optimize_model(model, tmp_path, target=target, passes=PASSES, name=name)


def assert_fused(model, tmp_path, dims=({},), target="ort-cpu"):
    result = run(model, tmp_path, target)
    assert op_counts(result.model) == {"com.microsoft::FusedConv": 1}, result.report.near_misses
    for d in dims:
        assert_equivalent(model, result.model, dims=d or None)
    assert not run(result.model, tmp_path, target, name="again").report.fusions
    return fused_node(result.model)


def assert_declined(model, tmp_path, reason: str, target="ort-cpu") -> None:
    result = run(model, tmp_path, target)
    assert not result.report.fusions
    assert [n.op_type for n in result.model.graph.node] == [n.op_type for n in model.graph.node]
    misses = [m.reason for m in result.report.near_misses if m.pass_name == "fused-conv"]
    assert misses and reason in misses[0], misses


ACTIVATIONS = {  # op, attributes, inputs after the Conv output, expected activation_params
    "relu": ("Relu", {}, (), None),
    "sigmoid": ("Sigmoid", {}, (), None),
    "tanh": ("Tanh", {}, (), None),
    "leaky-relu": ("LeakyRelu", {"alpha": 0.2}, (), [0.2]),
    "leaky-relu-default": ("LeakyRelu", {}, (), [0.01]),
    "hard-sigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, (), [0.3, 0.4]),
    "hard-sigmoid-default": ("HardSigmoid", {}, (), [0.2, 0.5]),
    "clip": ("Clip", {}, (-0.5, 0.75), [-0.5, 0.75]),
    "clip-min-only": ("Clip", {}, (0.0,), [0.0, np.inf]),
    "clip-max-only": ("Clip", {}, ("", 6.0), [-np.inf, 6.0]),
    "clip-unbounded": ("Clip", {}, (), [-np.inf, np.inf]),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_conv_activation_fuses(tmp_path, kind, bias):
    op, attrs, extra, params = ACTIVATIONS[kind]
    b = GraphBuilder(opset=17)
    c = conv(b, b.input("x", [2, 3, 8, 8]), bias=bias, pads=[1, 1, 1, 1], strides=[2, 1])
    bounds = [e if e == "" else b.const(np.float32(e)) for e in extra]
    model = b.build(b.op(op, c, *bounds, **attrs), output_names=["y"])
    node, fused = assert_fused(model, tmp_path)
    assert fused["activation"] == op and fused["pads"] == [1, 1, 1, 1] and fused["strides"] == [2, 1]
    assert len(node.input) == 2 + bias
    if params is None:
        assert "activation_params" not in fused
    else:
        np.testing.assert_array_equal(fused["activation_params"], np.float32(params))


@pytest.mark.parametrize("attrs, params", [({"min": -1.0, "max": 2.5}, [-1.0, 2.5]), ({}, [-FLT_MAX, FLT_MAX])],
                         ids=["bounds", "schema-defaults"])
def test_clip_attributes_before_opset_11(tmp_path, attrs, params):
    b = GraphBuilder(opset=10)
    model = b.build(b.op("Clip", conv(b, b.input("x", [1, 3, 6, 6])), **attrs), output_names=["y"])
    _, fused = assert_fused(model, tmp_path)
    np.testing.assert_array_equal(fused["activation_params"], np.float32(params))


@pytest.mark.parametrize("shape, kernel, attrs", [([2, 3, 12], (3,), {"dilations": [2]}),
                                                  ([1, 4, 5, 6, 6], (3, 3, 3), {"group": 2, "pads": [1] * 6})],
                         ids=["1d", "3d-grouped"])
def test_other_ranks_keep_conv_attributes(tmp_path, shape, kernel, attrs):
    b = GraphBuilder()
    c = conv(b, b.input("x", shape), c_in=shape[1], kernel=kernel, **attrs)
    model = b.build(b.op("LeakyRelu", c, alpha=0.1), output_names=["y"])
    _, fused = assert_fused(model, tmp_path)
    assert all(fused[k] == v for k, v in attrs.items())


@pytest.mark.parametrize("act", ["Relu", "Sigmoid"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("commuted", [False, True], ids=["conv-first", "residual-first"])
def test_residual_add_becomes_z(tmp_path, act, bias, commuted):
    b = GraphBuilder()
    x, z = b.input("x", ["batch", 3, 8, 8]), b.input("z", ["batch", 4, 8, 8])
    c = conv(b, x, bias=bias, pads=[1, 1, 1, 1])
    model = b.build(b.op(act, b.op("Add", *((z, c) if commuted else (c, z)))), output_names=["y"])
    node, fused = assert_fused(model, tmp_path, dims=({"batch": 1}, {"batch": 3}))
    assert list(node.input[2:]) == ([node.input[2]] if bias else [""]) + ["z"] and fused["activation"] == act


@pytest.mark.parametrize("target", ["ort", "ort-cuda"])
def test_targets_that_may_run_on_cuda_decline_it(tmp_path, target):
    """onnxruntime-gpu 1.31's CUDA FusedConv measured 1.8-2.5x slower than Conv + Relu on an H200."""
    b = GraphBuilder()
    c = conv(b, b.input("x", [1, 3, 6, 6]))
    model = b.build(b.op("Relu", c), b.op("Sigmoid", conv(b, "x")), output_names=["y", "s"])
    result = run(model, tmp_path, target=target)
    assert op_counts(result.model) == {"Conv": 2, "Relu": 1, "Sigmoid": 1}
    misses = [m.reason for m in result.report.near_misses if m.pass_name == "fused-conv"]
    assert len(misses) == 2 and all("CUDA FusedConv measured" in r and "--target ort-cpu fuses it" in r
                                    for r in misses)
    cpu = run(model, tmp_path, target="ort-cpu", name="cpu")
    assert op_counts(cpu.model) == {"com.microsoft::FusedConv": 2}
    assert_equivalent(model, cpu.model)


def test_onnx_target_never_runs_it():
    assert "fused-conv" not in pipeline_for("onnx") and "fused-conv" in pipeline_for("ort")
    with pytest.raises(UsageError, match="cannot run"):
        resolve("onnx", PASSES)


def _read_elsewhere(b):
    c = conv(b, b.input("x", [1, 3, 6, 6]))
    return b.build(b.op("Relu", c), b.op("Neg", c, name="reader"), output_names=["y", "t"])


def _fp16(b, activation="Relu", *bounds):
    c = conv(b, b.input("x", [1, 3, 6, 6], TensorProto.FLOAT16), dtype=np.float16)
    return b.build(b.op(activation, c, *(b.const(np.array(v, np.float16)) for v in bounds)), output_names=["y"])


def _clip_runtime_min(b):
    c = conv(b, b.input("x", [1, 3, 6, 6]))
    return b.build(b.op("Clip", c, b.input("lo", [], TensorProto.FLOAT), b.const(np.float32(6))), output_names=["y"])


def _broadcast_residual(b):
    c = conv(b, b.input("x", [2, 3, 6, 6]))
    return b.build(b.op("Relu", b.op("Add", c, b.input("z", [1, 4, 4, 4]))), output_names=["y"])


def _symbolic_broadcast(b):
    c = conv(b, b.input("x", ["batch", 3, 6, 6]))
    return b.build(b.op("Relu", b.op("Add", c, b.input("z", ["n", 4, 4, 4]))), output_names=["y"])


def _self_residual(b):
    c = conv(b, b.input("x", [1, 3, 6, 6]))
    return b.build(b.op("Relu", b.op("Add", c, c)), output_names=["y"])


NEGATIVES = {
    "read-elsewhere": (_read_elsewhere, "is also read by reader"),
    "clip-runtime-min": (_clip_runtime_min, "min 'lo' is a graph input, not a constant"),
    "broadcast-residual": (_broadcast_residual, "broadcasts: the residual 'z' has shape [1, 4, 4, 4]"),
    "symbolic-broadcast": (_symbolic_broadcast, "broadcasts: the residual 'z' has shape ['n', 4, 4, 4]"),
    "self-residual": (_self_residual, "output to itself"),
}


@pytest.mark.parametrize("activation, bounds", [("Relu", ()), ("Clip", (0, 6))])
def test_float16_fuses_on_the_cpu_where_the_nodes_it_replaces_ran_in_float32(activation, bounds, tmp_path):
    """The CPU provider has no float16 Conv or Relu: it runs both between Casts to float32 it inserts,
    as it runs the float32-only FusedConv. Its float16 Clip rounds nothing: run in float32, the same."""
    model = _fp16(GraphBuilder(), activation, *bounds)
    node, attrs = assert_fused(model, tmp_path)
    assert attrs["activation"] == activation


@pytest.mark.parametrize("kind", NEGATIVES)
def test_declines_with_reason(tmp_path, kind):
    build, reason = NEGATIVES[kind]
    assert_declined(build(GraphBuilder()), tmp_path, reason)
