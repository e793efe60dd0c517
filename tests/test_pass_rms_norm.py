"""rms-norm: decomposed RMSNorm -> RMSNormalization (opset 23)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fuse_cli.verify import make_session
from tests.conftest import assert_equivalent, assert_one_norm_with_float32_stash, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts
from tests.norm_graphs import rms_norm

HIDDEN = 16


def decomposed_rms_norm(*, opset=23, x_shape=("batch", 5, HIDDEN), axes=(-1,), square="pow", divide="div",
                        gamma_shape=(HIDDEN,), commuted=False, eps_input=False, reader=False,
                        centered=False, gate=False) -> onnx.ModelProto:
    """x * 1/sqrt(mean(x^2) + eps) * gamma as T5/Llama exports write it; `divide` is "div",
    "reciprocal" or "rsqrt" (torch's rsqrt: Div(1, Sqrt)); `centered` feeds x - mean(x) instead of x;
    `gamma_shape=None` leaves Mul(gamma) out; `gate` multiplies the result by x (a runtime tensor)."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", list(x_shape))
    y, *extra = rms_norm(b, x, axes=axes, square=square, divide=divide, gamma_shape=gamma_shape, commuted=commuted,
                         eps_input=eps_input, reader=reader, centered=centered)
    y = b.op("Mul", y, x) if gate else y
    return b.build(y, *extra, output_names=["y", "z"][: 1 + len(extra)])


def _ort_runs_rms_normalization() -> bool:
    b = GraphBuilder(opset=23)
    model = b.build(b.op("RMSNormalization", b.input("x", [2, 4]), b.const(np.ones(4, np.float32))))
    try:
        make_session(model).run(None, {"x": np.ones((2, 4), np.float32)})
    except Exception:  # onnxruntime raises its own exception types
        return False
    return True


needs_ort_rms = pytest.mark.skipif(not _ort_runs_rms_normalization(),
                                   reason="the installed onnxruntime has no CPU kernel for RMSNormalization-23")


POSITIVE = {
    "pow-div": {},
    "mul-square": {"square": "mul"},
    "reciprocal": {"divide": "reciprocal"},
    "rsqrt-div-one": {"divide": "rsqrt"},
    "commuted": {"divide": "reciprocal", "square": "mul", "commuted": True},
    "two-axes": {"x_shape": ("batch", 4, 6), "axes": (1, 2), "gamma_shape": (1, 6)},
    "no-gamma": {"gamma_shape": None},
    "no-gamma-rsqrt-commuted": {"gamma_shape": None, "divide": "rsqrt", "commuted": True},
}


@needs_ort_rms
@pytest.mark.parametrize("kw", POSITIVE.values(), ids=POSITIVE.keys())
def test_fuses_to_rms_normalization(tmp_path, kw):
    model = decomposed_rms_norm(**kw)
    result = optimize_model(model, tmp_path, passes=("rms-norm",))
    assert op_counts(result.model) == {"RMSNormalization": 1}
    (node,) = result.model.graph.node
    if kw.get("gamma_shape", ()) is None:
        gamma = next(t for t in result.model.graph.initializer if t.name == node.input[1])
        assert (numpy_helper.to_array(gamma) == 1).all()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["axis"] == -len(kw.get("axes", (-1,))) and attrs["epsilon"] == pytest.approx(1e-6)
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("rms-norm",)).report.fusions


@pytest.mark.parametrize("kw, reason", [
    ({"eps_input": True}, "'eps' is a graph input, not a constant"),
    ({"gamma_shape": (5, 1)}, "broadcasts over a non-normalized axis 1"),
    ({"axes": (1,)}, "not trailing axes ending at the last"),
    ({"reader": True}, "is also read by reader"),
    ({"opset": 17}, "needs opset 23, the model has opset 17: pass --upgrade-opset 23"),
    ({"gamma_shape": None, "axes": (1,)}, "not trailing axes ending at the last"),
    ({"gamma_shape": None, "opset": 17}, "needs opset 23"),
], ids=["eps-not-constant", "gamma-over-sequence", "non-trailing-axis", "square-read-elsewhere",
        "opset17", "no-gamma-non-trailing-axis", "no-gamma-opset17"])
def test_near_miss(tmp_path, kw, reason):
    model = decomposed_rms_norm(**kw)
    assert_declined(model, optimize_model(model, tmp_path, passes=("rms-norm",)), "rms-norm", reason)


@pytest.mark.parametrize("kw", [{"centered": True}, {"gamma_shape": None, "centered": True}],
                         ids=["centered", "no-gamma-centered"])
def test_layer_norm_is_not_a_near_miss(tmp_path, kw):
    """x - mean(x) squared is a LayerNorm: not this pattern, so no near-miss (layer-norm reports it)."""
    model = decomposed_rms_norm(**kw)
    result = optimize_model(model, tmp_path, passes=("rms-norm",))
    assert not result.report.fusions and not result.report.near_misses


@needs_ort_rms
def test_without_gamma_fuses_before_a_runtime_mul(tmp_path):
    """rms(x) * x multiplies by a runtime tensor, not gamma: the norm fuses and the Mul stays."""
    model = decomposed_rms_norm(gamma_shape=None, gate=True)
    result = optimize_model(model, tmp_path, passes=("rms-norm",))
    assert op_counts(result.model) == {"RMSNormalization": 1, "Mul": 1}
    assert not result.report.near_misses
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})


@pytest.mark.parametrize("gamma", [True, False], ids=["gamma", "no-gamma"])
def test_torch_float16_rms_norm_fuses_on_the_float16_input_with_stash_type(tmp_path, gamma):
    """x16 -> Cast(float) -> RMSNorm -> Cast(float16) -> Mul(gamma16): RMSNormalization's own
    stash_type=1 definition, one node on x16 (not four: the Casts, the float32 norm, the Mul)."""
    from tests.test_pass_simplified_norm import torch_half_rms_norm
    model = torch_half_rms_norm(gamma)
    result = optimize_model(model, tmp_path, upgrade_opset=23, passes=("rms-norm",))
    assert op_counts(result.model) == {"RMSNormalization": 1}
    assert_one_norm_with_float32_stash(model, result.model)


def test_a_float16_rms_norm_cast_back_to_another_type_fuses_only_its_float32_part(tmp_path):
    """Cast to float64 after the float32 RMSNorm is no round trip: not the stash_type form (silent,
    not a near-miss); the float32 norm between the Casts still fuses, on the Cast's output."""
    from tests.test_pass_simplified_norm import torch_half_rms_norm
    model = torch_half_rms_norm(gamma=False, back_to=onnx.TensorProto.DOUBLE)
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    result = optimize_model(model, tmp_path, upgrade_opset=23, passes=("rms-norm",))
    assert op_counts(result.model) == {"Cast": 2, "RMSNormalization": 1}
    (node,) = [n for n in result.model.graph.node if n.op_type == "RMSNormalization"]
    assert node.input[0] != "x"
    assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 3})



def test_a_float16_rms_norm_scaled_in_float32_fuses_its_float32_part_with_gamma(tmp_path):
    """Gemma: (x.float() normalized) * (1 + w) in float32, then .type_as(x). Scaling before the Cast
    back is not RMSNormalization's stash_type order (it casts, then scales), so the float32 norm
    with its gamma fuses between the Casts, as in the float32 model."""
    b = GraphBuilder(opset=17)
    x = b.op("Cast", b.input("x", ["batch", "sequence", HIDDEN], onnx.TensorProto.FLOAT16), to=onnx.TensorProto.FLOAT)
    (y,) = rms_norm(b, x, gamma_shape=(HIDDEN,), divide="reciprocal")
    model = b.build(b.op("Cast", y, to=onnx.TensorProto.FLOAT16), output_names=["y"])
    result = optimize_model(model, tmp_path, upgrade_opset=23, passes=("rms-norm",))
    assert op_counts(result.model) == {"Cast": 2, "RMSNormalization": 1}
    (node,) = [n for n in result.model.graph.node if n.op_type == "RMSNormalization"]
    gamma = next(t for t in result.model.graph.initializer if t.name == node.input[1])
    assert gamma.data_type == onnx.TensorProto.FLOAT and not (numpy_helper.to_array(gamma) == 1).all()
    assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 3})
