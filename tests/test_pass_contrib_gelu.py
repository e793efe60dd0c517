"""contrib-gelu, fast-gelu, quick-gelu, bias-gelu: GELU-family activations -> onnxruntime's kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for
from tests.conftest import assert_equivalent, optimize_model, saved_by_onnxruntime
from tests.graphs import GraphBuilder, assert_declined, op_counts, signature

HIDDEN = 6
MS = "com.microsoft::"
GELU, FAST, BIAS, QUICK = ({MS + op: 1} for op in ("Gelu", "FastGelu", "BiasGelu", "QuickGelu"))


def activation(form, *, opset=17, x_shape=("batch", HIDDEN), bias_shape=None, bias_input=False, cube="pow",
               half="outside", alpha=1.702, alpha_shape=(), commuted=False, const_shape=(), dtype=np.float32):
    """input (+ bias) -> the activation `form`: "erf" and "tanh" GELU as torch exports them
    ((x * gate) * 0.5, (0.5 * x) * gate or x * (0.5 * gate)), "gelu"/"gelu-tanh" (the standard op), "quick"
    (x * Sigmoid(alpha * x)) or "silu" (x * Sigmoid(x)). `const_shape` shapes the 0.5."""
    b = GraphBuilder(opset=opset)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", list(x_shape), elem)
    if bias_shape is not None:
        bias = b.input("bias", list(bias_shape), elem) if bias_input else b.const(b.rand(*bias_shape).astype(dtype))
        x = b.op("Add", *((bias, x) if commuted else (x, bias)))

    def c(value, shape=()):
        return b.const(np.full(shape, value, dtype))

    if form in ("erf", "tanh"):
        if form == "erf":
            gate = b.op("Erf", b.op("Div", x, c(math.sqrt(2.0))))
        else:
            x3 = b.op("Pow", x, c(3.0)) if cube == "pow" else b.op("Mul", x, b.op("Mul", x, x))
            gate = b.op("Tanh", b.op("Mul", c(math.sqrt(2.0 / math.pi)), b.op("Add", x, b.op("Mul", c(0.044715), x3))))
        gate = b.op("Add", gate, c(1.0))
        if half == "outside":
            y = b.op("Mul", b.op("Mul", x, gate), c(0.5, const_shape))
        elif half == "on-gate":
            y = b.op("Mul", x, b.op("Mul", c(0.5, const_shape), gate))
        else:
            y = b.op("Mul", b.op("Mul", c(0.5, const_shape), x), gate)
    elif form in ("gelu", "gelu-tanh"):
        y = b.op("Gelu", x, **({"approximate": "tanh"} if form == "gelu-tanh" else {}))
    else:
        factors = (c(alpha, alpha_shape), x)
        scaled = x if form == "silu" else b.op("Mul", *(factors if commuted else factors[::-1]))
        y = b.op("Mul", *((b.op("Sigmoid", scaled), x) if commuted else (x, b.op("Sigmoid", scaled))))
    return b.build(y, output_names=["y"])


def run(model, tmp_path, passes, target="ort-cpu", name="model"):
    return optimize_model(model, tmp_path, target=target, passes=passes, name=name)


def attrs_of(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


ALL = ("contrib-gelu", "fast-gelu", "quick-gelu", "bias-gelu")
POSITIVE = {
    "erf": ({"form": "erf"}, ("contrib-gelu",), GELU),
    "erf-half-on-x": ({"form": "erf", "half": "on-x"}, ("contrib-gelu",), GELU),
    "erf-half-on-gate": ({"form": "erf", "half": "on-gate"}, ("contrib-gelu",), GELU),
    "gelu-standard": ({"form": "gelu", "opset": 20}, ("contrib-gelu",), GELU),
    "erf-bias": ({"form": "erf", "bias_shape": (HIDDEN,)}, ("contrib-gelu", "bias-gelu"), BIAS),
    "erf-bias-commuted-3d": ({"form": "erf", "x_shape": ("batch", 3, HIDDEN), "bias_shape": (1, HIDDEN),
                              "commuted": True}, ("contrib-gelu", "bias-gelu"), BIAS),
    "gelu-standard-bias": ({"form": "gelu", "opset": 20, "bias_shape": (HIDDEN,)}, ("bias-gelu",), BIAS),
    "tanh-pow": ({"form": "tanh"}, ("fast-gelu",), FAST),
    "tanh-cube-half-on-x": ({"form": "tanh", "cube": "mul", "half": "on-x"}, ("fast-gelu",), FAST),
    "tanh-bias": ({"form": "tanh", "bias_shape": (HIDDEN,)}, ("fast-gelu",), FAST),
    "tanh-bias-half-on-gate": ({"form": "tanh", "bias_shape": (HIDDEN,), "half": "on-gate"}, ("fast-gelu",), FAST),
    "tanh-bias-2d": ({"form": "tanh", "bias_shape": (1, HIDDEN), "commuted": True}, ("fast-gelu",), FAST),
    "gelu-tanh-bias": ({"form": "gelu-tanh", "opset": 20, "bias_shape": (HIDDEN,)}, ("fast-gelu",), FAST),
    "tanh-bias-over-batch": ({"form": "tanh", "x_shape": (4, HIDDEN), "bias_shape": (4, 1)}, ("fast-gelu",),
                             {"Add": 1, MS + "FastGelu": 1}),  # that bias stays an Add; the GELU still fuses
    "quick": ({"form": "quick"}, ("quick-gelu",), QUICK),
    "quick-commuted": ({"form": "quick", "commuted": True, "alpha_shape": (1,)}, ("quick-gelu",), QUICK),
    "silu": ({"form": "silu"}, ("quick-gelu",), QUICK),
    "silu-commuted": ({"form": "silu", "commuted": True}, ("quick-gelu",), QUICK),
}


@pytest.mark.parametrize("kw, passes, counts", POSITIVE.values(), ids=POSITIVE.keys())
def test_fuses(tmp_path, kw, passes, counts):
    model = activation(**kw)
    target = "ort-cuda" if counts == BIAS else "ort-cpu"  # BiasGelu is declined where the CPU may run it
    result = run(model, tmp_path, passes, target=target)
    assert op_counts(result.model) == counts
    fused = result.model.graph.node[-1]
    absorbed = "bias_shape" in kw and "Add" not in counts
    assert len(fused.input) == (2 if absorbed else 1)
    if fused.op_type == "QuickGelu":
        assert attrs_of(fused)["alpha"] == pytest.approx(1.0 if kw["form"] == "silu" else 1.702)
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not run(result.model, tmp_path, ALL, target=target, name="again").report.fusions


@pytest.mark.parametrize("target, commuted", [("ort-cpu", False), ("ort-cpu", True), ("ort", False)])
def test_bias_gelu_declined_where_the_cpu_runs_it(tmp_path, target, commuted):
    """onnxruntime's CPU BiasGelu measured slower than Add + Gelu: the bias Add stays."""
    model = activation(form="gelu", opset=20, bias_shape=(HIDDEN,), commuted=commuted)
    assert_declined(model, run(model, tmp_path, ("bias-gelu",), target=target), "bias-gelu",
                    "CPU BiasGelu measured 1.04-1.28x slower than the Add + Gelu")
    fused = run(model, tmp_path, ("contrib-gelu", "bias-gelu"), target=target, name="contrib")
    assert op_counts(fused.model) == {"Add": 1, MS + "Gelu": 1}


def test_tanh_forms_are_not_contrib_gelu_and_erf_is_not_fast_gelu(tmp_path):
    for form, passes in (("gelu-tanh", ("contrib-gelu", "bias-gelu")), ("erf", ("fast-gelu",))):
        model = activation(form=form, opset=20, bias_shape=(HIDDEN,))
        result = run(model, tmp_path, passes, name=form)
        assert not result.report.fusions and not result.report.near_misses
        assert signature(result.model) == signature(model)


def test_x_times_half_times_half_is_not_a_gelu(tmp_path):
    b = GraphBuilder(opset=17)
    model = b.build(b.op("Mul", b.op("Mul", b.input("x", [2, HIDDEN]), b.const(0.5)), b.const(0.5)), output_names=["y"])
    result = run(model, tmp_path, ALL)
    assert not result.report.fusions and not result.report.near_misses


@pytest.mark.parametrize("kw, passes, reason", [
    ({"form": "gelu", "opset": 20, "bias_shape": (HIDDEN,), "bias_input": True}, ("bias-gelu",),
     "'bias' is a graph input, not a constant"),
    ({"form": "gelu", "opset": 20, "x_shape": (4, HIDDEN), "bias_shape": (4, 1)}, ("bias-gelu",),
     "does not broadcast over the last axis [6] alone"),
    ({"form": "quick", "alpha_shape": (HIDDEN,)}, ("quick-gelu",), "of shape [6], not one alpha"),
    ({"form": "erf", "const_shape": (1, 1, 1)}, ("contrib-gelu",), "has rank 3, more than 'x''s 2"),
    ({"form": "quick", "alpha_shape": (1, 1, 1)}, ("quick-gelu",), "has rank 3, more than 'x''s 2"),
], ids=["bias-not-constant", "bias-over-batch", "alpha-vector",
        "half-of-higher-rank", "alpha-of-higher-rank"])
def test_near_miss(tmp_path, kw, passes, reason):
    model = activation(**kw)
    result = run(model, tmp_path, passes, target="ort-cuda" if passes == ("bias-gelu",) else "ort-cpu")
    assert not result.report.fusions and signature(result.model) == signature(model)
    (miss,) = {m.reason for m in result.report.near_misses if m.pass_name == passes[-1]}
    assert reason in miss


@pytest.mark.parametrize("kw, passes, fused", [
    ({"form": "gelu", "opset": 20}, ("contrib-gelu",), "Gelu"),
    ({"form": "erf"}, ("contrib-gelu",), "Gelu"),
    ({"form": "tanh", "bias_shape": (HIDDEN,)}, ("fast-gelu",), "FastGelu"),
    ({"form": "quick"}, ("quick-gelu",), "QuickGelu"),
], ids=["standard-gelu", "erf", "tanh-with-bias", "quick"])
def test_fp16_on_cpu_runs_its_float32_kernel_between_casts(tmp_path, kw, passes, fused):
    """At float16 the CPU provider would run the fused operator's function body (the very nodes it
    replaced), so ort-cpu writes the Casts to float32 and back around it: its float32 kernel runs,
    as the replaced nodes ran in float32 between the Casts the provider inserts."""
    model = activation(dtype=np.float16, **kw)
    result = run(model, tmp_path, passes)
    assert op_counts(result.model) == {"Cast": 2, MS + fused: 1}
    (node,) = [n for n in result.model.graph.node if n.op_type == fused]
    widen, narrow = (next(n for n in result.model.graph.node if n.op_type == "Cast" and name in n.output)
                     for name in (node.input[0], "y"))
    assert [a.i for a in widen.attribute] == [TensorProto.FLOAT]
    assert [a.i for a in narrow.attribute] == [TensorProto.FLOAT16] and narrow.input[0] == node.output[0]
    # what the CPU provider runs: the fused kernel, not its body (nor any Cast of its own)
    assert op_counts(saved_by_onnxruntime(result.model, tmp_path)) == op_counts(result.model)
    for batch in (1, 5):
        assert_equivalent(model, result.model, dims={"batch": batch})


def test_fp16_not_fused_where_cuda_would_run_it_in_float32(tmp_path):
    """`ort` promises CUDA too, whose float16 kernel Casts to float32 would slow: no island there."""
    model = activation(form="gelu", opset=20, dtype=np.float16)
    result = run(model, tmp_path, ("contrib-gelu",), target="ort")
    assert not result.report.fusions and signature(result.model) == signature(model)
    (miss,) = {m.reason for m in result.report.near_misses if m.pass_name == "contrib-gelu"}
    assert "Gelu has no float16 kernel on onnxruntime's CPU provider" in miss


def test_fp16_allowed_where_cuda_runs_it(tmp_path):
    result = run(activation(form="gelu", opset=20, dtype=np.float16), tmp_path, ("contrib-gelu",), target="ort-cuda")
    assert op_counts(result.model) == GELU


def test_rank2_linear_gelu_becomes_bias_gelu_not_gemm(tmp_path):
    """bias-gelu runs before matmul-add, which would otherwise take the rank-2 MatMul's bias into Gemm
    (on ort-cuda: ort-cpu declines BiasGelu and keeps that Gemm)."""
    b = GraphBuilder(opset=17)
    h = b.op("Add", b.op("MatMul", b.input("x", ["batch", 8]), b.const(b.rand(8, HIDDEN))), b.const(b.rand(HIDDEN)))
    gate = b.op("Add", b.op("Erf", b.op("Div", h, b.const(math.sqrt(2.0)))), b.const(1.0))
    model = b.build(b.op("Mul", b.op("Mul", h, gate), b.const(0.5)), output_names=["y"])
    result = optimize_model(model, tmp_path, target="ort-cuda")
    assert op_counts(result.model) == {"MatMul": 1, MS + "BiasGelu": 1}
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    portable = optimize_model(model, tmp_path, name="portable", target="onnx")
    assert op_counts(portable.model)["Gemm"] == 1  # what the ordering prevents
    cpu = optimize_model(model, tmp_path, name="cpu", target="ort-cpu")
    assert op_counts(cpu.model) == {"Gemm": 1, MS + "Gelu": 1}  # BiasGelu declined: the Gemm takes the bias


@pytest.mark.parametrize("name", ALL)
def test_not_for_the_onnx_target(tmp_path, name):
    assert name not in pipeline_for("onnx")
    with pytest.raises(UsageError, match="cannot run"):
        run(activation(form="erf"), tmp_path, (name,), target="onnx")

