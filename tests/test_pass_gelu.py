"""gelu: GELU written out with Erf or Tanh -> Gelu (opset 20)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts


def decomposed_gelu(*, opset=20, form="erf", half="outside", scale="div", cube="pow", half_value=0.5,
                    sqrt2=math.sqrt(2.0), reader=False, dtype=np.float32) -> onnx.ModelProto:
    """torch.onnx.export's GELU (erf: (x * (erf(x / sqrt2) + 1)) * 0.5; tanh: 0.5 * (x * (tanh(..) + 1))
    with x * (x * x)); `half="on-x"` is the HF form (0.5 * x) * gate."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 6], TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT)

    def c(value):
        return b.const(value, dtype=dtype)

    if form == "erf":
        scaled = b.op("Div", x, c(sqrt2)) if scale == "div" else b.op("Mul", x, c(1.0 / sqrt2))
        inner = b.op("Erf", scaled, name="erf")
    else:
        x3 = b.op("Pow", x, c(3.0)) if cube == "pow" else b.op("Mul", x, b.op("Mul", x, x))
        inner = b.op("Tanh", b.op("Mul", c(math.sqrt(2.0 / math.pi)), b.op("Add", x, b.op("Mul", c(0.044715), x3))),
                     name="erf")
    gate = b.op("Add", inner, c(1.0))
    if half == "outside" and form == "tanh":
        y = b.op("Mul", c(half_value), b.op("Mul", x, gate))
    elif half == "outside":
        y = b.op("Mul", b.op("Mul", x, gate), c(half_value))
    else:
        y = b.op("Mul", b.op("Mul", c(half_value), x), gate)
    extra = [b.op("Neg", inner, name="reader")] if reader else []
    return b.build(y, *extra, output_names=["y", "z"][: 1 + len(extra)])


POSITIVE = {
    "erf-div-half-outside": {},
    "erf-div-half-on-x": {"half": "on-x"},
    "erf-mul-half-outside": {"scale": "mul"},
    "erf-mul-half-on-x": {"scale": "mul", "half": "on-x"},
    "erf-float32-constant": {"sqrt2": 1.4142135},
    "tanh-pow-half-outside": {"form": "tanh"},
    "tanh-cube-half-outside": {"form": "tanh", "cube": "mul"},
    "tanh-pow-half-on-x": {"form": "tanh", "half": "on-x"},
    "tanh-cube-half-on-x": {"form": "tanh", "cube": "mul", "half": "on-x"},
}


@pytest.mark.parametrize("kw", POSITIVE.values(), ids=POSITIVE.keys())
def test_fuses_to_gelu(tmp_path, kw):
    model = decomposed_gelu(**kw)
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert op_counts(result.model) == {"Gelu": 1}
    (node,) = result.model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs.get("approximate", b"none") == (b"tanh" if kw.get("form") == "tanh" else b"none")
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("gelu",)).report.fusions


def _signature(m):
    return [(n.op_type, list(n.input), list(n.output)) for n in m.graph.node]


@pytest.mark.parametrize("kw", [{"half_value": 0.6}, {"sqrt2": 1.5}, {"form": "tanh", "half_value": 0.6}],
                         ids=["erf-half-0.6", "erf-sqrt2-1.5", "tanh-half-0.6"])
def test_wrong_constant_is_not_gelu(tmp_path, kw):
    model = decomposed_gelu(**kw)
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert not result.report.fusions and not result.report.near_misses
    assert _signature(result.model) == _signature(model)


def test_half_twice_is_a_near_miss(tmp_path):
    b = GraphBuilder(opset=20)
    y = b.op("Mul", b.op("Mul", b.input("x", [2, 6]), b.const(0.5)), b.const(0.5))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert _signature(result.model) == _signature(model)
    assert "multiplies x by 0.5 twice" in result.report.near_misses[0].reason


@pytest.mark.parametrize("kw, reason", [
    ({"opset": 17}, "needs opset 20, the model has opset 17: pass --upgrade-opset 20"),
    ({"reader": True}, "is also read by reader"),
    ({"form": "tanh", "reader": True}, "is also read by reader"),
    ({"dtype": np.float64}, "computes in float64"),
], ids=["opset17", "erf-read-elsewhere", "tanh-read-elsewhere", "float64"])
def test_near_miss(tmp_path, kw, reason):
    model = decomposed_gelu(**kw)
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert not result.report.fusions
    assert _signature(result.model) == _signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "gelu"]
    assert reason in miss
