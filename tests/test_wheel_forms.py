"""Forms found in trained models that application wheels ship (benchmarks/corpus/wheels.py, issue 32
item 5), rebuilt with the graph builder and perturbed weights: no corpus file is under 200 KB (PP-OCR's
direction classifier, the smallest, is 585 KB).

paddle2onnx writes hard swish after a Conv as x * relu6(x + 3) / 6 with x the Conv's output
(PP-OCR v2 classifier 18 times, v4 detector 24). Below opset 14 (no HardSwish) the one explanation
is hard-swish's opset hint: the + 3 is the activation's own arithmetic, not a bias conv-add could
fold, nor a residual for FusedConv.
"""

from __future__ import annotations

import math

import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

SETTINGS = ({"batch": 1, "height": 5, "width": 7}, {"batch": 3, "height": 11, "width": 13})


def conv(b: GraphBuilder, x: str) -> str:
    """A trained-looking Conv: random weights and a bias, nothing 0 or 1."""
    return b.op("Conv", x, b.const(b.rand(8, 4, 3, 3)), b.const(b.rand(8, low=0.1, high=0.9)), pads=[1, 1, 1, 1])


def paddle_conv_hard_swish(opset: int = 12) -> "onnx.ModelProto":  # noqa: F821 - annotation only
    """Conv -> x * Clip(x + 3, 0, 6) / 6, as paddle2onnx exports PP-OCR's hard swish."""
    b = GraphBuilder(opset=opset, seed=3)
    x = b.input("x", ["batch", 4, "height", "width"])
    y = conv(b, x)
    gate = b.op("Clip", b.op("Add", y, b.const(3.0)), b.const(0.0), b.const(6.0))
    return b.build(b.op("Div", b.op("Mul", y, gate), b.const(6.0)), output_names=["out"])


def misses(result) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for miss in result.report.near_misses:
        found.setdefault(miss.pass_name, []).append(miss.reason)
    return found


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("opset", [11, 12])
def test_paddle_hard_swish_has_one_explanation(tmp_path, target, opset):
    model = paddle_conv_hard_swish(opset)
    result = optimize_model(model, tmp_path, target=target)
    found = misses(result)
    assert found.keys() == {"hard-swish"}, found
    assert "needs opset 14" in found["hard-swish"][0] and "--upgrade-opset 14" in found["hard-swish"][0]
    assert op_counts(result.model)["Conv"] == 1  # nothing folded into the Conv: its output is the gate's x
    for dims in SETTINGS:
        assert_equivalent(model, result.model, dims=dims)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_paddle_hard_swish_fuses_at_opset_14(tmp_path, target):
    model = paddle_conv_hard_swish(12)
    result = optimize_model(model, tmp_path, target=target, upgrade_opset=14)
    assert op_counts(result.model) == {"Conv": 1, "HardSwish": 1}
    assert not result.report.near_misses
    for dims in SETTINGS:
        assert_equivalent(model, result.model, dims=dims)


def test_erf_gelu_after_conv_is_not_a_conv_mul_near_miss(tmp_path):
    """GELU's x / sqrt(2) after a Conv is the activation's first step, like hard swish's + 3."""
    b = GraphBuilder(opset=17, seed=4)
    y = conv(b, b.input("x", ["batch", 4, "height", "width"]))
    gate = b.op("Add", b.op("Erf", b.op("Div", y, b.const(math.sqrt(2.0)))), b.const(1.0))
    model = b.build(b.op("Mul", b.op("Mul", y, gate), b.const(0.5)), output_names=["out"])
    result = optimize_model(model, tmp_path, target="onnx")
    assert misses(result).keys() == {"gelu"}
    assert "needs opset 20" in misses(result)["gelu"][0]


def test_conv_output_read_elsewhere_is_still_a_near_miss(tmp_path):
    """Must not fire: a Conv's output read by a second branch (not a gate over the Add) keeps its
    near-miss: the Add is a bias that a graph with one reader would fold."""
    b = GraphBuilder(opset=12, seed=5)
    y = conv(b, b.input("x", ["batch", 4, "height", "width"]))
    biased = b.op("Relu", b.op("Add", y, b.const(b.rand(1, 8, 1, 1)), name="bias"))
    side = b.op("Mul", y, b.const(b.rand(1, 8, 1, 1)), name="side")
    model = b.build(biased, side, output_names=["out", "side"])
    result = optimize_model(model, tmp_path, target="ort-cpu")
    found = misses(result)
    assert any("is also read by side" in reason for reason in found["conv-add"]), found
    assert any("is also read by" in reason for reason in found["fused-conv"]), found
    for dims in SETTINGS:
        assert_equivalent(model, result.model, dims=dims)


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
def test_conv_bias_add_without_a_gate_still_folds(tmp_path, target):
    b = GraphBuilder(opset=12, seed=6)
    y = conv(b, b.input("x", ["batch", 4, "height", "width"]))
    model = b.build(b.op("Clip", b.op("Add", y, b.const(b.rand(1, 8, 1, 1))), b.const(0.0), b.const(6.0)),
                    output_names=["out"])
    result = optimize_model(model, tmp_path, target=target)
    expected = {"com.microsoft::FusedConv": 1} if target == "ort-cpu" else {"Conv": 1, "Clip": 1}
    assert op_counts(result.model) == expected
    for dims in SETTINGS:
        assert_equivalent(model, result.model, dims=dims)
