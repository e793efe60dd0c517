"""fused-gemm: Gemm + activation -> com.microsoft FusedGemm (onnxruntime CPU only)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for, resolve
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

PASSES = ("fused-gemm",)
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def gemm_model(act: str, act_attrs=None, *, opset: int = 17, trans_a: int = 0, trans_b: int = 1, bias=(16,),
               dtype=TensorProto.FLOAT, **gemm_attrs):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    b = GraphBuilder(opset=opset)
    a = b.input("a", [8, "m"] if trans_a else ["m", 8], dtype)
    w = b.const(b.rand(*((16, 8) if trans_b else (8, 16)), dtype=np_dtype))
    c = [b.const(b.rand(*bias, dtype=np_dtype))] if bias is not None else []
    y = b.op("Gemm", a, w, *c, transA=trans_a, transB=trans_b, **gemm_attrs)
    return b.build(b.op(act, y, **(act_attrs or {})), output_names=["y"])


def fused_attrs(model):
    (node,) = [n for n in model.graph.node if n.op_type == "FusedGemm"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return node, {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}


def run(model, tmp_path, target="ort-cpu", name="model"):
    return optimize_model(model, tmp_path, target=target, passes=PASSES, name=name)


ACTIVATIONS = {  # op, attributes, expected activation_* attributes
    "relu": ("Relu", {}, {}),
    "sigmoid": ("Sigmoid", {}, {}),
    "tanh": ("Tanh", {}, {}),
    "softplus": ("Softplus", {}, {}),
    "softsign": ("Softsign", {}, {}),
    "leaky-relu": ("LeakyRelu", {"alpha": 0.2}, {"activation_alpha": 0.2}),
    "leaky-relu-default": ("LeakyRelu", {}, {"activation_alpha": 0.01}),
    "elu-default": ("Elu", {}, {"activation_alpha": 1.0}),
    "thresholded-relu": ("ThresholdedRelu", {"alpha": 0.3}, {"activation_alpha": 0.3}),
    "hard-sigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, {"activation_alpha": 0.3, "activation_beta": 0.4}),
    "hard-sigmoid-default": ("HardSigmoid", {}, {"activation_alpha": 0.2, "activation_beta": 0.5}),
    "selu-default": ("Selu", {}, {"activation_alpha": SELU_ALPHA, "activation_gamma": SELU_GAMMA}),
}


@pytest.mark.parametrize("kind", ACTIVATIONS)
def test_gemm_activation_fuses(tmp_path, kind):
    op, attrs, expected = ACTIVATIONS[kind]
    model = gemm_model(op, attrs, alpha=0.5, beta=2.0)
    result = run(model, tmp_path)
    assert op_counts(result.model) == {"com.microsoft::FusedGemm": 1}
    for dims in ({"m": 1}, {"m": 3}):
        assert_equivalent(model, result.model, dims=dims)
    node, fused = fused_attrs(result.model)
    assert fused.pop("activation") == op and len(node.input) == 3
    assert {k: fused.pop(k) for k in ("alpha", "beta", "transA", "transB")} == {"alpha": 0.5, "beta": 2.0,
                                                                                "transA": 0, "transB": 1}
    assert fused.keys() == expected.keys()
    np.testing.assert_allclose([fused[k] for k in expected], list(expected.values()), rtol=1e-7)
    assert not run(result.model, tmp_path, name="again").report.fusions


@pytest.mark.parametrize("trans_a, trans_b, bias", [(1, 0, (16,)), (0, 0, None), (1, 1, (1, 16)), (0, 1, ())],
                         ids=["transA", "no-C", "both-trans", "scalar-C"])
def test_gemm_layouts(tmp_path, trans_a, trans_b, bias):
    model = gemm_model("Relu", trans_a=trans_a, trans_b=trans_b, bias=bias)
    result = run(model, tmp_path)
    assert op_counts(result.model) == {"com.microsoft::FusedGemm": 1}
    assert_equivalent(model, result.model, dims={"m": 5})
    node, fused = fused_attrs(result.model)
    assert (fused["transA"], fused["transB"], len(node.input)) == (trans_a, trans_b, 2 + (bias is not None))


def test_opset_6_broadcast_attribute_is_dropped(tmp_path):
    model = gemm_model("Relu", opset=6, broadcast=1)
    result = run(model, tmp_path)
    assert op_counts(result.model) == {"com.microsoft::FusedGemm": 1}
    assert "broadcast" not in fused_attrs(result.model)[1]
    # onnxruntime has no Gemm-6 kernel: compare with the same weights at opset 7, where C always broadcasts
    assert_equivalent(gemm_model("Relu", opset=7), result.model, dims={"m": 2})


@pytest.mark.parametrize("target", ["ort", "ort-cuda", "onnx"])
def test_only_the_cpu_target_runs_it(target):
    assert "fused-gemm" in pipeline_for("ort-cpu") and "fused-gemm" not in pipeline_for(target)
    with pytest.raises(UsageError, match="cannot run"):
        resolve(target, PASSES)


def test_fp16_fuses_where_the_cpu_ran_the_gemm_and_relu_in_float32(tmp_path):
    """No float16 Gemm or Relu kernel on the CPU provider: both ran between Casts to float32, as the
    float32-only FusedGemm does."""
    model = gemm_model("Relu", dtype=TensorProto.FLOAT16)
    result = run(model, tmp_path)
    assert op_counts(result.model) == {"com.microsoft::FusedGemm": 1}
    assert_equivalent(model, result.model, dims={"m": 3})


def test_gemm_output_read_elsewhere_is_a_near_miss(tmp_path):
    b = GraphBuilder()
    y = b.op("Gemm", b.input("a", [4, 8]), b.const(b.rand(8, 16)))
    model = b.build(b.op("Relu", y), b.op("Neg", y, name="reader"), output_names=["y", "n"])
    result = run(model, tmp_path)
    assert op_counts(result.model) == {"Gemm": 1, "Relu": 1, "Neg": 1}
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "fused-gemm"]
    assert "is also read by reader" in miss
