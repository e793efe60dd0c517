"""layer-norm: decomposed LayerNorm (torch.onnx.export below opset 17) -> LayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import assert_equivalent, assert_one_norm_with_float32_stash, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

HIDDEN = 16


def decomposed_layer_norm(*, opset=17, x_shape=("batch", 5, HIDDEN), axes=(-1,), var_axes=None, square="pow",
                          divide="div", gamma_shape=(HIDDEN,), beta_shape=(HIDDEN,), commuted=False,
                          eps_input=False, reader=False, fp16=False, residual=False, eps_shape=(),
                          widen=None) -> onnx.ModelProto:
    """The graph torch.onnx.export writes for nn.LayerNorm at opset 14 (ReduceMean axes as an input
    from opset 18): mean, Sub, Pow(2), mean, Add(eps), Sqrt, Div, Mul(gamma), Add(beta).
    `gamma_shape=None` / `beta_shape=None` leave Mul(gamma) / Add(beta) out (elementwise_affine=False,
    bias=False); `fp16` wraps the math in Cast(float)/Cast(float16); `residual` adds x at the end.
    `widen` (an onnx type): torch's other float16 form, the mean and x - mean in float16, x - mean
    Cast to `widen` for the variance and the division, Cast back to float16."""
    b = GraphBuilder(opset=opset)
    fp16 = fp16 or widen is not None
    dtype = np.float16 if fp16 else np.float32
    x = b.input("x", list(x_shape), TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT)
    xf = b.op("Cast", x, to=TensorProto.FLOAT) if fp16 and widen is None else x
    wide = helper.tensor_dtype_to_np_dtype(widen) if widen is not None else np.float32

    def reduce_mean(t, reduce_axes):
        if opset >= 18:
            return b.op("ReduceMean", t, b.const(list(reduce_axes), dtype=np.int64), keepdims=1)
        return b.op("ReduceMean", t, axes=list(reduce_axes), keepdims=1)

    centered = b.op("Sub", xf, reduce_mean(xf, axes))
    centered = b.op("Cast", centered, to=widen) if widen is not None else centered
    squared = b.op("Pow", centered, b.const(2.0, dtype=wide)) if square == "pow" else b.op("Mul", centered, centered)
    eps = b.input("eps", []) if eps_input else b.const(np.full(eps_shape, 1e-5, wide))
    std = b.op("Sqrt", b.op("Add", reduce_mean(squared, var_axes or axes), eps))
    if divide == "div":
        y = b.op("Div", centered, std)
    else:
        y = b.op("Mul", *((b.op("Reciprocal", std), centered) if commuted else (centered, b.op("Reciprocal", std))))
    y = b.op("Cast", y, to=TensorProto.FLOAT16) if fp16 else y
    if gamma_shape is not None:
        gamma = b.const(b.rand(*gamma_shape, low=0.5, high=1.5).astype(dtype))
        y = b.op("Mul", *((gamma, y) if commuted else (y, gamma)))
    if beta_shape is not None:
        beta = b.const(b.rand(*beta_shape).astype(dtype))
        y = b.op("Add", *((beta, y) if commuted else (y, beta)))
    y = b.op("Add", y, x) if residual else y
    extra = [b.op("Neg", centered, name="reader")] if reader else []
    return b.build(y, *extra, output_names=["y", "z"][: 1 + len(extra)])


POSITIVE = {
    "pow-div": {},
    "reciprocal-mul": {"divide": "reciprocal"},
    "mul-variance": {"square": "mul"},
    "commuted": {"divide": "reciprocal", "commuted": True},
    "opset18-axes-input": {"opset": 18},
    "positive-axes": {"axes": (2,), "var_axes": (-1,)},
    "two-axes": {"x_shape": ("batch", 4, 6), "axes": (-2, -1), "gamma_shape": (4, 6), "beta_shape": (6,)},
    "no-gamma": {"gamma_shape": None},
    "no-beta": {"beta_shape": None},
    "no-beta-commuted-reciprocal": {"beta_shape": None, "divide": "reciprocal", "commuted": True},
    "no-affine": {"gamma_shape": None, "beta_shape": None},
    "no-affine-reciprocal-opset18": {"gamma_shape": None, "beta_shape": None, "divide": "reciprocal", "opset": 18},
    "gamma-leading-ones": {"gamma_shape": (1, 1, HIDDEN), "beta_shape": (1,)},
}


@pytest.mark.parametrize("kw", POSITIVE.values(), ids=POSITIVE.keys())
def test_fuses_to_layer_normalization(tmp_path, kw):
    model = decomposed_layer_norm(**kw)
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert op_counts(result.model) == {"LayerNormalization": 1}
    (node,) = result.model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert len(node.input) == (2 if kw.get("beta_shape", ()) is None else 3)
    if kw.get("gamma_shape", ()) is None:
        gamma = next(t for t in result.model.graph.initializer if t.name == node.input[1])
        assert (numpy_helper.to_array(gamma) == 1).all()
    assert attrs["axis"] == -len(kw.get("axes", (-1,)))
    assert attrs["epsilon"] == pytest.approx(1e-5)
    assert [o.name for o in result.model.graph.output] == ["y"]
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("layer-norm",)).report.fusions


@pytest.mark.parametrize("kw", [{}, {"beta_shape": None}, {"gamma_shape": None, "beta_shape": None}],
                         ids=["affine", "no-beta", "no-affine"])
def test_fp16_cast_wrapped_fuses_with_stash_type(tmp_path, kw):
    model = decomposed_layer_norm(fp16=True, **kw)
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert op_counts(result.model) == {"LayerNormalization": 1}
    (node,) = result.model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.input[0] == "x" and attrs["stash_type"] == 1
    assert len(node.input) == (2 if "beta_shape" in kw else 3)
    # fp16 tolerance (rtol 1e-2, atol 1e-3): onnxruntime rounds to fp16 once, after gamma and beta,
    # where the decomposed graph also rounds the normalized value
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch}, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("widen", [TensorProto.DOUBLE, TensorProto.FLOAT], ids=["float64", "float32"])
@pytest.mark.parametrize("kw", [{}, {"beta_shape": None}, {"divide": "reciprocal"}],
                         ids=["affine", "no-beta", "reciprocal"])
def test_fp16_with_a_widened_variance_fuses_with_stash_type(tmp_path, kw, widen):
    """torch.onnx.export of a half() LayerNorm at opset 14: mean and x - mean in float16, the
    variance and the division in float64; LayerNormalization's float32 stash is within float16's
    rounding of it."""
    model = decomposed_layer_norm(widen=widen, x_shape=("batch", "sequence", HIDDEN), **kw)
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert op_counts(result.model) == {"LayerNormalization": 1}
    assert_one_norm_with_float32_stash(model, result.model)


def test_a_widened_variance_cast_back_to_another_type_is_a_near_miss(tmp_path):
    model = decomposed_layer_norm(widen=TensorProto.DOUBLE, gamma_shape=None, beta_shape=None)
    cast_out = next(n for n in model.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16)
    cast_out.attribute[0].i = TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert not result.report.fusions
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "layer-norm"]
    assert "not to the float16/bfloat16 type of 'x'" in miss


def test_full_pipeline_and_upgrade_from_opset14(tmp_path):
    model = decomposed_layer_norm(opset=14)
    result = optimize_model(model, tmp_path, upgrade_opset=17)
    assert op_counts(result.model) == {"LayerNormalization": 1}
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_onnxruntime_targets_fuse_opset14_without_converting(tmp_path):
    """onnxruntime registers LayerNormalization below opset 17, so its targets need no upgrade;
    the portable target still does (see the near-miss below)."""
    model = decomposed_layer_norm(opset=14)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("layer-norm",))
    assert op_counts(result.model) == {"LayerNormalization": 1}
    assert result.model.opset_import[0].version == 14
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})


@pytest.mark.parametrize("kw, reason", [
    ({"eps_input": True}, "'eps' is a graph input, not a constant"),
    ({"gamma_shape": (5, 1)}, "broadcasts over a non-normalized axis 1"),
    ({"gamma_shape": (3, 1, HIDDEN), "x_shape": (3, 5, HIDDEN)}, "broadcasts over a non-normalized axis 0"),
    ({"axes": (1,)}, "not trailing axes ending at the last"),
    ({"axes": (-1,), "var_axes": (-2, -1)}, "reduces from axis 1, the mean from axis 2"),
    ({"reader": True}, "is also read by reader"),
    ({"opset": 14}, "needs opset 17, the model has opset 14: pass --upgrade-opset 17"),
    ({"beta_shape": None, "gamma_shape": (5, 1)}, "broadcasts over a non-normalized axis 1"),
    ({"beta_shape": (5, 1)}, "beta 'c_4' of shape [5, 1] broadcasts over a non-normalized axis 1"),
    ({"gamma_shape": None, "beta_shape": None, "axes": (1,)}, "not trailing axes ending at the last"),
    ({"gamma_shape": None, "beta_shape": None, "opset": 14}, "needs opset 17"),
    ({"gamma_shape": None, "beta_shape": None, "reader": True}, "is also read by reader"),
    ({"eps_shape": (1, 1, 1, 1)}, "of shape [1, 1, 1, 1] broadcasts 'x' (rank 3) to rank 4"),
], ids=["eps-not-constant", "gamma-over-sequence", "gamma-over-batch", "non-trailing-axis", "different-axes",
        "sub-read-elsewhere", "opset14", "no-beta-gamma-over-sequence", "beta-over-sequence",
        "no-affine-non-trailing-axis", "no-affine-opset14", "no-affine-sub-read-elsewhere", "eps-raises-rank"])
def test_near_miss(tmp_path, kw, reason):
    model = decomposed_layer_norm(**kw)
    assert_declined(model, optimize_model(model, tmp_path, passes=("layer-norm",)), "layer-norm", reason)


@pytest.mark.parametrize("kw, left", [
    ({"beta_shape": None, "residual": True}, {"Add": 1}),
    ({"gamma_shape": None, "beta_shape": None, "residual": True}, {"Add": 1}),
], ids=["no-beta-then-residual", "no-affine-then-residual"])
def test_smaller_form_fuses_before_a_runtime_add(tmp_path, kw, left):
    """Add(LN(x) * gamma, x) is a residual, not beta: the LayerNorm fuses and the Add stays."""
    model = decomposed_layer_norm(**kw)
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert op_counts(result.model) == {"LayerNormalization": 1, **left}
    assert not result.report.near_misses
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})


def test_float32_norm_cast_to_half_fuses_and_keeps_the_cast(tmp_path):
    """A float32 LayerNorm whose result is cast to float16 is not the stash_type round trip."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", HIDDEN])
    centered = b.op("Sub", x, b.op("ReduceMean", x, axes=[-1]))
    var = b.op("ReduceMean", b.op("Mul", centered, centered), axes=[-1])
    y = b.op("Div", centered, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
    model = b.build(b.op("Cast", y, to=TensorProto.FLOAT16), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert op_counts(result.model) == {"LayerNormalization": 1, "Cast": 1}
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch}, rtol=1e-3, atol=1e-3)


def test_square_of_another_difference_is_not_layer_norm(tmp_path):
    """The variance must square the Sub that the Div divides: (x - mean) / sqrt(mean(e^2) + eps) is not."""
    b = GraphBuilder(opset=17)
    x, e = b.input("x", ["batch", HIDDEN]), b.input("e", ["batch", HIDDEN])
    centered = b.op("Sub", x, b.op("ReduceMean", x, axes=[-1]))
    var = b.op("ReduceMean", b.op("Pow", b.op("Sub", e, b.op("ReduceMean", e, axes=[-1])), b.const(2.0)), axes=[-1])
    y = b.op("Div", centered, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
    model = b.build(b.op("Add", b.op("Mul", y, b.const(b.rand(HIDDEN))), b.const(b.rand(HIDDEN))), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("layer-norm",))
    assert not result.report.fusions and not result.report.near_misses
