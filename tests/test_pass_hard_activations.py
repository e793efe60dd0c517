"""hard-sigmoid and hard-swish: Clip-based piecewise-linear activations -> HardSigmoid / HardSwish."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts


def _signature(m):
    return [(n.op_type, list(n.input), list(n.output)) for n in m.graph.node]


def _clip(b: GraphBuilder, t: str, low: float, high: float) -> str:
    if b.opset < 11:
        return b.op("Clip", t, min=low, max=high)
    return b.op("Clip", t, b.const(low), b.const(high))


def hard_sigmoid(*, opset=17, form="mul-add", scale=0.2, shift=0.5, bounds=(0.0, 1.0), reader=False):
    """Clip(alpha * x + beta, 0, 1) in one of the forms exporters write (`form`: how the affine is built)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 8])
    if form == "mul-add":
        affine = b.op("Add", b.op("Mul", x, b.const(scale)), b.const(shift))
    elif form == "div-add":
        affine = b.op("Add", b.const(shift), b.op("Div", x, b.const(scale)))
    elif form == "add-mul":
        affine = b.op("Mul", b.const(scale), b.op("Add", x, b.const(shift)))
    else:
        affine = b.op("Div", b.op("Add", x, b.const(shift)), b.const(scale))
    extra = [b.op("Neg", affine, name="reader")] if reader else []
    return b.build(_clip(b, affine, *bounds), *extra, output_names=["y", "z"][: 1 + len(extra)])


HARD_SIGMOID = {
    "mul-add": ({}, 0.2, 0.5),
    "div-add": ({"form": "div-add", "scale": 6.0}, 1 / 6, 0.5),
    "add-mul": ({"form": "add-mul", "scale": 1 / 6, "shift": 3.0}, 1 / 6, 0.5),
    "add-div": ({"form": "add-div", "scale": 6.0, "shift": 3.0}, 1 / 6, 0.5),
    "clip-attributes-opset10": ({"opset": 10}, 0.2, 0.5),
}


@pytest.mark.parametrize("kw, alpha, beta", HARD_SIGMOID.values(), ids=HARD_SIGMOID.keys())
def test_fuses_to_hard_sigmoid(tmp_path, kw, alpha, beta):
    model = hard_sigmoid(**kw)
    result = optimize_model(model, tmp_path, passes=("hard-sigmoid",))
    assert op_counts(result.model) == {"HardSigmoid": 1}
    attrs = {a.name: helper.get_attribute_value(a) for a in result.model.graph.node[0].attribute}
    assert attrs["alpha"] == pytest.approx(alpha, rel=1e-6) and attrs["beta"] == pytest.approx(beta, rel=1e-6)
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("hard-sigmoid",)).report.fusions


@pytest.mark.parametrize("kw, reason", [
    ({"bounds": (0.0, 6.0)}, "clamps to [0, 6]; HardSigmoid clamps to [0, 1]"),
    ({"form": "div-add", "scale": 0.0}, "divides by zero"),
    ({"reader": True}, "is also read by reader"),
], ids=["relu6-bounds", "div-by-zero", "affine-read-elsewhere"])
def test_hard_sigmoid_near_miss(tmp_path, kw, reason):
    model = hard_sigmoid(**kw)
    result = optimize_model(model, tmp_path, passes=("hard-sigmoid",))
    assert not result.report.fusions and _signature(result.model) == _signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "hard-sigmoid"]
    assert reason in miss


def hard_swish(*, opset=14, gate="hard-sigmoid", alpha=1 / 6, beta=0.5, shift=3.0, commuted=False,
               reader=False) -> onnx.ModelProto:
    """x * gate(x): torch's x * HardSigmoid(x) (opset < 14) or Keras' x * (relu6(x + 3) / 6)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 8])
    if gate == "hard-sigmoid":
        g = b.op("HardSigmoid", x, alpha=alpha, beta=beta)
    elif gate == "clip-affine":  # leaves the gate to hard-sigmoid first
        g = _clip(b, b.op("Add", b.op("Mul", x, b.const(alpha)), b.const(beta)), 0.0, 1.0)
    else:
        relu6 = _clip(b, b.op("Add", x, b.const(shift)), 0.0, 6.0)
        g = b.op("Div", relu6, b.const(6.0)) if gate == "relu6-div" else b.op("Mul", b.const(1 / 6), relu6)
    extra = [b.op("Neg", g, name="reader")] if reader else []
    y = b.op("Mul", *((g, x) if commuted else (x, g)))
    return b.build(y, *extra, output_names=["y", "z"][: 1 + len(extra)])


HARD_SWISH = {
    "hard-sigmoid": {},
    "hard-sigmoid-commuted": {"commuted": True},
    "relu6-div": {"gate": "relu6-div"},
    "relu6-mul-sixth": {"gate": "relu6-mul", "commuted": True},
    "clip-affine-via-hard-sigmoid": {"gate": "clip-affine"},
}


@pytest.mark.parametrize("kw", HARD_SWISH.values(), ids=HARD_SWISH.keys())
def test_fuses_to_hard_swish(tmp_path, kw):
    model = hard_swish(**kw)
    result = optimize_model(model, tmp_path, passes=("hard-sigmoid", "hard-swish"))
    assert op_counts(result.model) == {"HardSwish": 1}
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("hard-swish",)).report.fusions


@pytest.mark.parametrize("kw, reason", [
    ({"alpha": 0.2}, "has alpha=0.2, beta=0.5; HardSwish is alpha=1/6, beta=0.5"),
    ({"gate": "relu6-div", "reader": True}, "is also read by reader"),
    ({"opset": 13}, "needs opset 14, the model has opset 13: pass --upgrade-opset 14"),
], ids=["alpha-0.2", "gate-read-elsewhere", "opset13"])
def test_hard_swish_near_miss(tmp_path, kw, reason):
    model = hard_swish(**kw)
    result = optimize_model(model, tmp_path, passes=("hard-swish",))
    assert not result.report.fusions and _signature(result.model) == _signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "hard-swish"]
    assert reason in miss


def test_relu6_shift_other_than_three_is_not_hard_swish(tmp_path):
    model = hard_swish(gate="relu6-div", shift=2.0)
    result = optimize_model(model, tmp_path, passes=("hard-swish",))
    assert not result.report.fusions and not result.report.near_misses
    assert _signature(result.model) == _signature(model)
