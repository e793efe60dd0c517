"""gelu: GELU written out with Erf or Tanh -> Gelu (opset 20)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts


def decomposed_gelu(*, opset=20, form="erf", half="outside", scale="div", cube="pow", half_value=0.5,
                    sqrt2=math.sqrt(2.0), reader=False, dtype=np.float32, half_shape=()) -> onnx.ModelProto:
    """torch.onnx.export's GELU (erf: (x * (erf(x / sqrt2) + 1)) * 0.5; tanh: 0.5 * (x * (tanh(..) + 1))
    with x * (x * x)); `half="on-x"` is the HF form (0.5 * x) * gate, `half="on-gate"` x * (0.5 * gate)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 6], helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))

    def c(value):
        return b.const(value, dtype=dtype)

    if form == "erf":
        scaled = b.op("Div", x, c(sqrt2)) if scale == "div" else b.op("Mul", x, c(1.0 / sqrt2))
        inner = b.op("Erf", scaled, name="erf")
    else:
        if cube == "jax":  # jax2tf: x * (x * (0.044715 * x))
            scaled_cube = b.op("Mul", x, b.op("Mul", x, b.op("Mul", c(0.044715), x)))
        else:
            x3 = b.op("Pow", x, c(3.0)) if cube == "pow" else b.op("Mul", x, b.op("Mul", x, x))
            scaled_cube = b.op("Mul", c(0.044715), x3)
        inner = b.op("Tanh", b.op("Mul", c(math.sqrt(2.0 / math.pi)), b.op("Add", x, scaled_cube)), name="erf")
    gate = b.op("Add", inner, c(1.0))
    half_const = c(np.full(half_shape, half_value, dtype))
    if half == "outside" and form == "tanh":
        y = b.op("Mul", half_const, b.op("Mul", x, gate))
    elif half == "outside":
        y = b.op("Mul", b.op("Mul", x, gate), half_const)
    elif half == "on-gate":
        y = b.op("Mul", x, b.op("Mul", half_const, gate))
    else:
        y = b.op("Mul", b.op("Mul", half_const, x), gate)
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
    "erf-div-half-on-gate": {"half": "on-gate"},
    "tanh-pow-half-on-gate": {"form": "tanh", "half": "on-gate"},
    "tanh-jax2tf-cube": {"form": "tanh", "cube": "jax"},
    # model.half(): every constant stored in float16 (sqrt 2 as 1.4140625)
    "erf-float16": {"dtype": np.float16},
    "tanh-float16": {"form": "tanh", "cube": "mul", "dtype": np.float16},
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


@pytest.mark.parametrize("kw", [{"half_value": 0.6}, {"sqrt2": 1.5}, {"form": "tanh", "half_value": 0.6},
                                {"half": "on-gate", "half_value": 0.6},
                                # off by 0.3%: more than float16 rounds (0.05%), so not sqrt 2 even there
                                {"sqrt2": math.sqrt(2.0) * 1.003, "dtype": np.float16}],
                         ids=["erf-half-0.6", "erf-sqrt2-1.5", "tanh-half-0.6", "half-on-gate-0.6",
                              "float16-sqrt2-off"])
def test_wrong_constant_is_not_gelu(tmp_path, kw):
    model = decomposed_gelu(**kw)
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert not result.report.fusions and not result.report.near_misses
    assert _signature(result.model) == _signature(model)


@pytest.mark.parametrize("inner", ["x-half", "half-half"])
def test_half_twice_is_not_gelu(tmp_path, inner):
    """x * 0.5 * 0.5 and x * (0.5 * 0.5) have no gate: not a GELU, and no near-miss claiming one."""
    b = GraphBuilder(opset=20)
    x = b.input("x", [2, 6])
    y = (b.op("Mul", b.op("Mul", x, b.const(0.5)), b.const(0.5)) if inner == "x-half"
         else b.op("Mul", x, b.op("Mul", b.const(0.5), b.const(0.5))))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert _signature(result.model) == _signature(model)
    assert not result.report.fusions and not result.report.near_misses


def test_gate_twice_is_not_gelu(tmp_path):
    """(x * gate) * gate has no 0.5: not a GELU."""
    b = GraphBuilder(opset=20)
    x = b.input("x", [2, 6])
    gate = b.op("Add", b.op("Erf", b.op("Div", x, b.const(math.sqrt(2.0)))), b.const(1.0))
    model = b.build(b.op("Mul", b.op("Mul", x, gate), gate), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert not result.report.fusions and not result.report.near_misses


@pytest.mark.parametrize("kw, reason", [
    ({"opset": 17}, "needs opset 20, the model has opset 17: pass --upgrade-opset 20"),
    ({"reader": True}, "is also read by reader"),
    ({"form": "tanh", "reader": True}, "is also read by reader"),
    ({"half": "on-gate", "reader": True}, "is also read by reader"),
    ({"half": "on-gate", "opset": 17}, "needs opset 20"),
    ({"half_shape": (1, 1, 1)}, "of shape [1, 1, 1] broadcasts 'x' (rank 2) to rank 3"),
], ids=["opset17", "erf-read-elsewhere", "tanh-read-elsewhere", "on-gate-read-elsewhere",
        "on-gate-opset17", "half-raises-rank"])
def test_near_miss(tmp_path, kw, reason):
    model = decomposed_gelu(**kw)
    result = optimize_model(model, tmp_path, passes=("gelu",))
    assert not result.report.fusions
    assert _signature(result.model) == _signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "gelu"]
    assert reason in miss


def test_a_real_jax2tf_export_fuses_its_tanh_gelu(tmp_path):
    """tests/data/flax_ln_gelu_jax2tf.onnx (see its .py): Flax's tanh GELU as jax2tf and tf2onnx
    write it, 0.5 * (1 + tanh(0.7978845834732056 * (x + x * (x * (0.044715 * x))))) * x."""
    from tests.conftest import REPO

    model = onnx.load(REPO / "tests" / "data" / "flax_ln_gelu_jax2tf.onnx")
    result = optimize_model(model, tmp_path, upgrade_opset=20)
    assert op_counts(result.model)["Gelu"] == 1 and "Tanh" not in op_counts(result.model)
    assert [r.pass_name for r in result.report.fusions].count("gelu") == 1
    for dims in ({"unk__65": 2, "unk__66": 3}, {"unk__65": 3, "unk__66": 7}):
        assert_equivalent(model, result.model, dims=dims)
