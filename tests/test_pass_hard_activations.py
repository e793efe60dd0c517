"""hard-sigmoid and hard-swish: Clip-based piecewise-linear activations -> HardSigmoid / HardSwish."""

from __future__ import annotations

import numpy as np
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


def _clamp(b: GraphBuilder, t: str, low: float, high: float, clamp: str = "clip") -> str:
    if clamp == "min-max":
        return b.op("Min", b.op("Max", t, b.const(low)), b.const(high))
    if clamp == "max-min":
        return b.op("Max", b.const(low), b.op("Min", b.const(high), t))
    return _clip(b, t, low, high)


def hard_sigmoid(*, opset=17, form="mul-add", scale=0.2, shift=0.5, bounds=(0.0, 1.0), clamp="clip", reader=False,
                 scalar_shape=()):
    """Clip(alpha * x + beta, 0, 1) in one of the forms exporters write (`form`: how the affine is built,
    or "relu6-div"/"relu6-mul": Clip(x + shift, *bounds) / scale or * scale; `clamp`: Clip, Min/Max, Max/Min)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 8])
    k = b.const(np.full(scalar_shape, scale, np.float32))
    if form == "mul-add":
        affine = b.op("Add", b.op("Mul", x, k), b.const(shift))
    elif form == "div-add":
        affine = b.op("Add", b.const(shift), b.op("Div", x, k))
    elif form == "add-mul":
        affine = b.op("Mul", k, b.op("Add", x, b.const(shift)))
    elif form == "add-div":
        affine = b.op("Div", b.op("Add", x, b.const(shift)), k)
    else:
        affine = b.op("Add", x, b.const(shift))
    clamped = _clamp(b, affine, *bounds, clamp=clamp)
    if form == "relu6-div":
        clamped = b.op("Div", clamped, k)
    elif form == "relu6-mul":
        clamped = b.op("Mul", k, clamped)
    extra = [b.op("Neg", affine, name="reader")] if reader else []
    return b.build(clamped, *extra, output_names=["y", "z"][: 1 + len(extra)])


RELU6 = {"shift": 3.0, "bounds": (0.0, 6.0)}
HARD_SIGMOID = {
    "mul-add": ({}, 0.2, 0.5),
    "div-add": ({"form": "div-add", "scale": 6.0}, 1 / 6, 0.5),
    "add-mul": ({"form": "add-mul", "scale": 1 / 6, "shift": 3.0}, 1 / 6, 0.5),
    "add-div": ({"form": "add-div", "scale": 6.0, "shift": 3.0}, 1 / 6, 0.5),
    "clip-attributes-opset10": ({"opset": 10}, 0.2, 0.5),
    "min-max": ({"clamp": "min-max"}, 0.2, 0.5),
    "max-min-div-add": ({"clamp": "max-min", "form": "div-add", "scale": 6.0}, 1 / 6, 0.5),
    "relu6-div": ({"form": "relu6-div", "scale": 6.0, **RELU6}, 1 / 6, 0.5),
    "relu6-mul-sixth": ({"form": "relu6-mul", "scale": 1 / 6, **RELU6}, 1 / 6, 0.5),
    "relu6-div-opset10": ({"form": "relu6-div", "scale": 6.0, "opset": 10, **RELU6}, 1 / 6, 0.5),
    "relu6-min-max-div": ({"form": "relu6-div", "scale": 6.0, "clamp": "min-max", **RELU6}, 1 / 6, 0.5),
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
    ({"clamp": "min-max", "bounds": (0.0, 6.0)}, "clamps to [0, 6]; HardSigmoid clamps to [0, 1]"),
    ({"form": "relu6-div", "scale": 6.0, "shift": 3.0, "bounds": (0.0, 5.0)},
     "clamps to [0, 5] before Div_1 scales by 0.166667; HardSigmoid needs [0, 6] there"),
    ({"form": "relu6-mul", "scale": 1 / 6, "reader": True, **RELU6}, "is also read by reader"),
    ({"scalar_shape": (1, 1, 1)}, "'c_1' of shape [1, 1, 1] broadcasts 'x' (rank 2) to rank 3"),
], ids=["relu6-bounds", "div-by-zero", "affine-read-elsewhere", "min-max-bounds", "relu6-div-bounds",
        "relu6-shift-read-elsewhere", "constant-raises-rank"])
def test_hard_sigmoid_near_miss(tmp_path, kw, reason):
    model = hard_sigmoid(**kw)
    result = optimize_model(model, tmp_path, passes=("hard-sigmoid",))
    assert not result.report.fusions and _signature(result.model) == _signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "hard-sigmoid"]
    assert reason in miss


def hard_swish(*, opset=14, gate="hard-sigmoid", alpha=1 / 6, beta=0.5, shift=3.0, bounds=(0.0, 6.0),
               commuted=False, reader=False) -> onnx.ModelProto:
    """x * gate(x): torch's x * HardSigmoid(x) (opset < 14) or Keras' x * (relu6(x + 3) / 6);
    gate "relu6-div-last"/"relu6-mul-last" is (x * relu6(x + 3)) / 6 or * (1/6)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 8])
    if gate == "hard-sigmoid":
        g = b.op("HardSigmoid", x, alpha=alpha, beta=beta)
    elif gate == "clip-affine":  # leaves the gate to hard-sigmoid first
        g = _clip(b, b.op("Add", b.op("Mul", x, b.const(alpha)), b.const(beta)), 0.0, 1.0)
    else:
        relu6 = _clip(b, b.op("Add", x, b.const(shift)), *bounds)
        if gate.endswith("-last"):
            g = b.op("Mul", *((relu6, x) if commuted else (x, relu6)))
            y = b.op("Div", g, b.const(6.0)) if gate == "relu6-div-last" else b.op("Mul", b.const(1 / 6), g)
            extra = [b.op("Neg", g, name="reader")] if reader else []
            return b.build(y, *extra, output_names=["y", "z"][: 1 + len(extra)])
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
    "relu6-div-last": {"gate": "relu6-div-last"},
    "relu6-mul-sixth-last": {"gate": "relu6-mul-last", "commuted": True},
}


@pytest.mark.parametrize("kw", HARD_SWISH.values(), ids=HARD_SWISH.keys())
def test_fuses_to_hard_swish(tmp_path, kw):
    model = hard_swish(**kw)
    # hard-swish reads every gate but the Clip(affine) one itself, whichever pass runs first
    alone = () if kw.get("gate") == "clip-affine" else (("hard-swish",),)
    for passes in (("hard-sigmoid", "hard-swish"), *alone):
        result = optimize_model(model, tmp_path, name="-".join(passes), passes=passes)
        assert op_counts(result.model) == {"HardSwish": 1}
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("hard-swish",)).report.fusions


@pytest.mark.parametrize("kw, reason", [
    ({"alpha": 0.2}, "has alpha=0.2, beta=0.5; HardSwish is alpha=1/6, beta=0.5"),
    ({"gate": "relu6-div", "reader": True}, "is also read by reader"),
    ({"opset": 13}, "needs opset 14, the model has opset 13: pass --upgrade-opset 14"),
    ({"gate": "relu6-div-last", "bounds": (0.0, 5.0)}, "clamps x + 3 to [0, 5]; relu6 clamps to [0, 6]"),
    ({"gate": "relu6-div", "bounds": (-1.0, 6.0)}, "clamps x + 3 to [-1, 6]; relu6 clamps to [0, 6]"),
    ({"gate": "relu6-mul-last", "reader": True}, "is also read by reader"),
    ({"gate": "relu6-div-last", "opset": 13}, "needs opset 14"),
], ids=["alpha-0.2", "gate-read-elsewhere", "opset13", "div-last-bounds", "relu6-low-bound", "mul-last-read-elsewhere",
        "div-last-opset13"])
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


@pytest.mark.parametrize("form", ["relu6-alone", "runtime-min-bound"])
def test_not_hard_sigmoid(tmp_path, form):
    """relu6(x + 3) without the / 6 is not a HardSigmoid, nor is a clamp to a runtime bound."""
    b = GraphBuilder(opset=17)
    x, y = b.input("x", ["batch", 8]), b.input("y", ["batch", 8])
    if form == "relu6-alone":
        out = _clip(b, b.op("Add", x, b.const(3.0)), 0.0, 6.0)
    else:
        out = b.op("Min", b.op("Max", b.op("Add", b.op("Mul", x, b.const(0.2)), b.const(0.5)), y), b.const(1.0))
    model = b.build(out, output_names=["out"])
    result = optimize_model(model, tmp_path, passes=("hard-sigmoid", "hard-swish"))
    assert not result.report.fusions and not result.report.near_misses
    assert _signature(result.model) == _signature(model)
