"""simplified-layer-norm: RMSNorm -> onnxruntime's SimplifiedLayerNormalization (default domain)."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for
from tests.conftest import assert_equivalent, assert_one_norm_with_float32_stash, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature
from tests.norm_graphs import rms_norm

HIDDEN = 16
PASS = "simplified-layer-norm"


def decomposed(*, opset=17, x_shape=("batch", 5, HIDDEN), **kw) -> onnx.ModelProto:
    b = GraphBuilder(opset=opset)
    outs = rms_norm(b, b.input("x", list(x_shape)), **kw)
    return b.build(*outs, output_names=["y", "z"][: len(outs)])


def attrs_of(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


POSITIVE = {
    "pow-div": {},
    "mul-square": {"square": "mul"},
    "reciprocal": {"divide": "reciprocal"},
    "rsqrt-div-one": {"divide": "rsqrt"},
    "commuted": {"divide": "reciprocal", "square": "mul", "commuted": True},
    "opset18-axes-input": {"opset": 18},
    "opset13": {"opset": 13},
    "two-axes": {"x_shape": ("batch", 4, 6), "axes": (1, 2), "gamma_shape": (1, 6)},
    "gamma-leading-ones": {"gamma_shape": (1, 1, HIDDEN)},
    "rank-4": {"x_shape": ("batch", 2, 5, HIDDEN)},
    # gamma all ones, removed by eliminate-noop-arith (random-init Llama), or no affine scale at all
    "no-gamma": {"gamma_shape": None},
    "no-gamma-rsqrt-commuted": {"gamma_shape": None, "divide": "rsqrt", "commuted": True},
}


@pytest.mark.parametrize("kw", POSITIVE.values(), ids=POSITIVE.keys())
def test_fuses_to_simplified_layer_normalization(tmp_path, kw):
    model = decomposed(**kw)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,))
    assert op_counts(result.model) == {"SimplifiedLayerNormalization": 1}
    (node,) = result.model.graph.node
    assert node.domain == ""  # where onnxruntime registers it
    attrs = attrs_of(node)
    assert attrs["axis"] == -len(kw.get("axes", (-1,))) and attrs["epsilon"] == pytest.approx(1e-6)
    for batch in (1, 3):  # assert_equivalent loads the result in onnxruntime CPU
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", target="ort-cpu", passes=(PASS,)).report.fusions


def test_not_standard_onnx_but_runs_in_onnxruntime(tmp_path):
    model = decomposed()
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,))
    with pytest.raises(onnx.checker.ValidationError, match="SimplifiedLayerNormalization"):
        onnx.checker.check_model(result.model, full_check=True)
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_rms_normalization_from_rms_norm_in_the_ort_pipeline(tmp_path):
    model = decomposed(opset=23)
    result = optimize_model(model, tmp_path, target="ort-cpu")
    assert op_counts(result.model) == {"SimplifiedLayerNormalization": 1}
    assert [f.pass_name for f in result.report.fusions] == ["rms-norm", PASS]
    assert attrs_of(result.model.graph.node[0])["epsilon"] == pytest.approx(1e-6)
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})


@pytest.mark.parametrize("kw, reason", [
    ({"eps_input": True}, "'eps' is a graph input, not a constant"),
    ({"gamma_shape": (5, 1)}, "broadcasts over a non-normalized axis 1"),
    ({"axes": (1,)}, "not trailing axes ending at the last"),
    ({"reader": True}, "is also read by reader"),
    ({"centered": True}, "squares x - mean(x): a LayerNorm (see layer-norm)"),
], ids=["eps-not-constant", "gamma-over-sequence", "non-trailing-axis", "square-read-elsewhere", "centered"])
def test_near_miss(tmp_path, kw, reason):
    model = decomposed(**kw)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,))
    assert not result.report.fusions and signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == PASS]
    assert reason in miss


def test_not_for_the_onnx_target(tmp_path):
    assert PASS not in pipeline_for("onnx")
    with pytest.raises(UsageError, match="cannot run"):
        optimize_model(decomposed(), tmp_path, target="onnx", passes=(PASS,))


def test_unit_gamma_removed_first_still_fuses(tmp_path):
    """Random-init exports carry gamma = ones: eliminate-noop-arith removes Mul(x, 1) first, and
    the default ort-cpu pipeline still ends with one SimplifiedLayerNormalization (it kept the
    whole RMSNorm decomposed, and told the user to upgrade to opset 23)."""
    from onnx import numpy_helper
    import numpy as np
    model = decomposed()
    for i, tensor in enumerate(model.graph.initializer):
        if list(tensor.dims) == [HIDDEN]:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.ones(HIDDEN, np.float32), tensor.name))
    result = optimize_model(model, tmp_path, target="ort-cpu")
    assert op_counts(result.model) == {"SimplifiedLayerNormalization": 1}
    assert not [m for m in result.report.near_misses if "upgrade-opset" in m.reason]
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})


def torch_half_rms_norm(gamma: bool = True, back_to=onnx.TensorProto.FLOAT16) -> onnx.ModelProto:
    """LlamaRMSNorm of a half() model: x.to(float32), the RMSNorm in float32, .to(input_dtype),
    then weight * (float16)."""
    import numpy as np

    b = GraphBuilder(opset=17)
    x16 = b.input("x", ["batch", "sequence", 16], onnx.TensorProto.FLOAT16)
    x = b.op("Cast", x16, to=onnx.TensorProto.FLOAT)
    (y,) = rms_norm(b, x, gamma_shape=None, divide="reciprocal")
    y = b.op("Cast", y, to=back_to)
    if gamma:
        y = b.op("Mul", b.const(b.rand(16, low=0.5, high=1.5).astype(np.float16)), y)
    return b.build(y, output_names=["y"])


@pytest.mark.parametrize("gamma", [True, False], ids=["gamma", "no-gamma"])
def test_torch_float16_rms_norm_fuses_with_stash_type(tmp_path, gamma):
    model = torch_half_rms_norm(gamma)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("simplified-layer-norm",))
    assert op_counts(result.model) == {"SimplifiedLayerNormalization": 1}
    assert_one_norm_with_float32_stash(model, result.model)


def test_a_float16_rms_norm_cast_back_to_another_type_fuses_only_its_float32_part(tmp_path):
    """Cast to float64 after the float32 RMSNorm: no round trip, so not the stash_type form; the
    float32 RMSNorm between the Casts still fuses, on the Cast's output."""
    model = torch_half_rms_norm(gamma=False, back_to=onnx.TensorProto.DOUBLE)
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("simplified-layer-norm",))
    assert op_counts(result.model) == {"Cast": 2, "SimplifiedLayerNormalization": 1}
    (node,) = [n for n in result.model.graph.node if n.op_type == "SimplifiedLayerNormalization"]
    assert node.input[0] != "x"
    assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 3})
