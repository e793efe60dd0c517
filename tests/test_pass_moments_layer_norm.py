"""moments-layer-norm: a LayerNorm written with moments (Flax's, through jax2tf and tf2onnx) ->
LayerNormalization. The graph below is the one tests/data/flax_ln_gelu_jax2tf.onnx holds, built
with other sizes and with or without gamma and beta."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import REPO, assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

HIDDEN = 12


def moments_layer_norm(*, gamma=True, beta=True, scale=1.0 / HIDDEN, axes=(2,), keep_shape=True) -> onnx.ModelProto:
    """ReduceSum(x) / N and ReduceSum(x*x) / N (keepdims=0), Max(0, E[x^2] - E[x]^2), both put back by
    Reshape + Expand to [Shape(x)[0], Shape(x)[1], 1] (`keep_shape=False`: to [Shape(x)[1], Shape(x)[0],
    1], a transposed broadcast), rsqrt as Sqrt + Reciprocal, gamma on the inverse."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", "sequence", HIDDEN])
    axes_c = b.const(np.array(axes, np.int64))

    def mean(t):
        return b.op("Mul", b.op("ReduceSum", t, axes_c, keepdims=0), b.const(np.float32(scale)))

    dims = b.op("Shape", x)
    first, second = (b.op("Slice", dims, b.const(np.array([i], np.int64)), b.const(np.array([i + 1], np.int64)))
                     for i in (0, 1))
    target = b.op("Concat", *((first, second) if keep_shape else (second, first)), b.const(np.array([1], np.int64)),
                  axis=0)

    def back(t):
        return b.op("Expand", b.op("Reshape", t, target), target)

    m1, m2 = mean(x), mean(b.op("Mul", x, x))
    variance = b.op("Max", b.const(np.float32(0.0)), b.op("Sub", m2, b.op("Mul", m1, m1)))
    inverse = b.op("Reciprocal", b.op("Sqrt", b.op("Add", back(variance), b.const(np.float32(1e-6)))))
    if gamma:
        inverse = b.op("Mul", inverse, b.const(b.rand(HIDDEN, low=0.5, high=1.5)))
    y = b.op("Mul", b.op("Sub", x, back(m1)), inverse)
    if beta:
        y = b.op("Add", y, b.const(b.rand(HIDDEN)))
    return b.build(y, output_names=["y"])


SETTINGS = ({"batch": 2, "sequence": 3}, {"batch": 5, "sequence": 7})


@pytest.mark.parametrize("kw", [{}, {"beta": False}, {"gamma": False}, {"gamma": False, "beta": False},
                                {"axes": (-1,)}], ids=["affine", "no-beta", "no-gamma", "no-affine", "negative-axis"])
def test_fuses_to_layer_normalization(tmp_path, kw):
    model = moments_layer_norm(**kw)
    result = optimize_model(model, tmp_path, passes=("moments-layer-norm",))
    assert op_counts(result.model)["LayerNormalization"] == 1 and "ReduceSum" not in op_counts(result.model)
    (node,) = [n for n in result.model.graph.node if n.op_type == "LayerNormalization"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.input[0] == "x" and attrs["axis"] == -1 and np.isclose(attrs["epsilon"], 1e-6)
    assert len(node.input) == (3 if kw.get("beta", True) else 2)
    for dims in SETTINGS:
        assert_equivalent(model, result.model, dims=dims)


@pytest.mark.parametrize("kw, reason", [
    ({"scale": 1.0 / (HIDDEN + 1)}, f"not 1/{HIDDEN}: not the mean over the normalized axes"),
    ({"keep_shape": False}, "the reduced axes are not provably put back where they were"),
    ({"axes": (1,)}, "not trailing axes ending at the last"),
], ids=["not-the-mean", "transposed-broadcast", "not-trailing"])
def test_near_miss(tmp_path, kw, reason):
    model = moments_layer_norm(**kw)
    result = optimize_model(model, tmp_path, passes=("moments-layer-norm",))
    assert not result.report.fusions and "LayerNormalization" not in op_counts(result.model)
    reasons = [m.reason for m in result.report.near_misses if m.pass_name == "moments-layer-norm"]
    assert any(reason in r for r in reasons), reasons


def test_the_real_jax2tf_export_fuses_its_layer_norm_and_gelu(tmp_path):
    model = onnx.load(REPO / "tests" / "data" / "flax_ln_gelu_jax2tf.onnx")
    result = optimize_model(model, tmp_path, upgrade_opset=20)
    counts = op_counts(result.model)
    assert counts["LayerNormalization"] == 1 and counts["Gelu"] == 1 and sum(counts.values()) == 4, counts
    for dims in ({"unk__65": 2, "unk__66": 3}, {"unk__65": 3, "unk__66": 7}):
        assert_equivalent(model, result.model, dims=dims)


def test_below_opset_17_the_portable_target_says_to_upgrade(tmp_path):
    model = moments_layer_norm()
    model.opset_import[0].version = 14
    result = optimize_model(model, tmp_path, passes=("moments-layer-norm",))
    (reason,) = [m.reason for m in result.report.near_misses if m.pass_name == "moments-layer-norm"]
    assert "--upgrade-opset 17" in reason
