"""skip-layer-norm, skip-simplified-layer-norm: residual Add (+ bias) + norm -> one onnxruntime op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature
from tests.test_pass_simplified_norm import rms_norm

HIDDEN = 16
SLN, SSLN = "com.microsoft::SkipLayerNormalization", "com.microsoft::SkipSimplifiedLayerNormalization"


def residual_norm(*, norm="layer", opset=17, x_shape=("batch", 5, HIDDEN), skip_shape=None, bias_shape=None,
                  bias_side="input", beta=True, gamma_shape=(HIDDEN,), epsilon=1e-3, axis=-1, reader=False,
                  sum_output=False, bias_reader=False, stats=False, fp16=False) -> onnx.ModelProto:
    """Add(Add(x, bias)?, skip) -> LayerNormalization (`norm="layer"`) or a decomposed RMSNorm
    (`"rms"`) or RMSNormalization (`"rmsnorm"`, opset 23). `reader` reads the sum elsewhere,
    `sum_output` makes it a graph output, `bias_reader` reads x + bias elsewhere; `epsilon=None`
    leaves LayerNormalization's epsilon at its default."""
    b = GraphBuilder(opset=opset)
    dtype = np.float16 if fp16 else np.float32
    elem = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    x, skip = b.input("x", list(x_shape), elem), b.input("skip", list(skip_shape or x_shape), elem)
    extra = []
    if bias_shape is not None:
        bias = b.const(b.rand(*bias_shape).astype(dtype))
        if bias_side == "input":
            x = b.op("Add", x, bias)
        else:
            skip = b.op("Add", bias, skip)
        extra += [b.op("Neg", x, name="bias_reader")] if bias_reader else []
    total = b.op("Add", x, skip, name="residual")
    extra += [b.op("Neg", total, name="reader")] if reader else []
    if norm == "layer":
        params = [b.const(b.rand(*gamma_shape, low=0.5, high=1.5).astype(dtype))]
        params += [b.const(b.rand(HIDDEN).astype(dtype))] if beta else []
        attrs = {"epsilon": epsilon} if epsilon is not None else {}
        outs = b.op("LayerNormalization", total, *params, axis=axis, outputs=3 if stats else 1, **attrs)
        y = outs[0] if stats else outs
        extra += [b.op("Neg", outs[1])] if stats else []
    elif norm == "rmsnorm":
        y = b.op("RMSNormalization", total, b.const(b.rand(HIDDEN, low=0.5, high=1.5)), epsilon=epsilon)
    else:
        (y,) = rms_norm(b, total)
    finals = [y, *extra] + ([total] if sum_output else [])
    return b.build(*finals, output_names=["y", *(f"z{i}" for i in range(len(finals) - 1))])


def run(model, tmp_path, passes, target="ort-cuda", name="model"):
    # ort-cuda is the only target that emits the skip operators (measured slow on CPU), and the
    # CPU provider still runs them, so the numerics are checked here
    return optimize_model(model, tmp_path, target=target, passes=passes, name=name)


def attrs_of(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def fused_node(model, op):
    (node,) = [n for n in model.graph.node if f"{n.domain}::{n.op_type}" == op]
    return node


LAYER = {
    "plain": ({}, {SLN: 1}),
    "bias": ({"bias_shape": (HIDDEN,)}, {SLN: 1}),
    "bias-rank3": ({"bias_shape": (1, 1, HIDDEN)}, {SLN: 1}),
    "bias-on-skip": ({"bias_shape": (HIDDEN,), "bias_side": "skip"}, {SLN: 1}),
    "no-beta": ({"beta": False}, {SLN: 1}),
    "no-beta-bias": ({"beta": False, "bias_shape": (HIDDEN,)}, {SLN: 1}),
    "gamma-leading-one": ({"gamma_shape": (1, HIDDEN)}, {SLN: 1}),
    "rank-2": ({"x_shape": ("seq", HIDDEN)}, {SLN: 1}),
    "axis-positive": ({"axis": 2}, {SLN: 1}),
    "default-epsilon": ({"epsilon": None}, {SLN: 1}),
    "sum-read-elsewhere": ({"reader": True}, {SLN: 1, "Neg": 1}),
    "sum-graph-output": ({"sum_output": True, "bias_shape": (HIDDEN,)}, {SLN: 1}),
    # the bias form declines (bias over the sequence axis, or x + bias read elsewhere); the plain one fuses
    "bias-over-sequence": ({"bias_shape": (5, 1)}, {SLN: 1, "Add": 1}),
    "bias-sum-read": ({"bias_shape": (HIDDEN,), "bias_reader": True}, {SLN: 1, "Add": 1, "Neg": 1}),
}


@pytest.mark.parametrize("kw, counts", LAYER.values(), ids=LAYER.keys())
def test_skip_layer_normalization(tmp_path, kw, counts):
    model = residual_norm(**kw)
    result = run(model, tmp_path, ("skip-layer-norm",))
    assert op_counts(result.model) == counts
    node = fused_node(result.model, SLN)
    # copied (LayerNormalization's default is 1e-5), never left to SkipLayerNormalization's 1e-12
    assert attrs_of(node)["epsilon"] == pytest.approx(kw.get("epsilon", 1e-3) or 1e-5)
    bias_absorbed = "bias_shape" in kw and counts.get("Add", 0) == 0
    assert len(node.input) == (5 if bias_absorbed else 3 if kw.get("beta") is False else 4)
    sum_kept = kw.get("reader") or kw.get("sum_output")
    assert len(node.output) == (4 if sum_kept else 1)
    assert [o.name for o in result.model.graph.output] == [o.name for o in model.graph.output]
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch, "seq": batch + 1})
    assert not run(result.model, tmp_path, ("skip-layer-norm",), name="again").report.fusions


def test_skip_layer_normalization_fp16(tmp_path):
    model = residual_norm(fp16=True, bias_shape=(HIDDEN,))
    result = run(model, tmp_path, ("skip-layer-norm",))
    assert op_counts(result.model) == {SLN: 1}
    # fp16 tolerance (rtol 1e-2, atol 1e-2): the fused kernel sums in float32, the graph rounds each Add to fp16
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch}, rtol=1e-2, atol=1e-2)


SIMPLIFIED = {
    "decomposed": ({"norm": "rms"}, {SSLN: 1}),
    "decomposed-bias-sum-read": ({"norm": "rms", "bias_shape": (HIDDEN,), "reader": True}, {SSLN: 1, "Neg": 1}),
    "rms-normalization": ({"norm": "rmsnorm", "opset": 23, "bias_shape": (HIDDEN,)}, {SSLN: 1}),
    "rank-2": ({"norm": "rms", "x_shape": ("seq", HIDDEN)}, {SSLN: 1}),
}


@pytest.mark.parametrize("kw, counts", SIMPLIFIED.values(), ids=SIMPLIFIED.keys())
def test_skip_simplified_layer_normalization(tmp_path, kw, counts):
    model = residual_norm(**kw)
    passes = ("simplified-layer-norm", "skip-simplified-layer-norm")
    result = run(model, tmp_path, passes)
    assert op_counts(result.model) == counts
    node = fused_node(result.model, SSLN)
    assert len(node.input) == (4 if "bias_shape" in kw else 3)
    assert len(node.output) == (4 if kw.get("reader") else 1)
    assert attrs_of(node)["epsilon"] == pytest.approx(1e-3 if kw["norm"] == "rmsnorm" else 1e-6)
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch, "seq": batch + 1})
    assert not run(result.model, tmp_path, passes, name="again").report.fusions


def test_full_pipeline_keeps_the_bias_of_a_rank2_linear(tmp_path):
    """matmul-add would make Gemm of MatMul + bias; skip-layer-norm runs first and takes the bias."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["seq", HIDDEN])
    projected = b.op("Add", b.op("MatMul", x, b.const(b.rand(HIDDEN, HIDDEN))), b.const(b.rand(HIDDEN)))
    total = b.op("Add", projected, x)
    y = b.op("LayerNormalization", total, b.const(b.rand(HIDDEN)), b.const(b.rand(HIDDEN)), epsilon=1e-5)
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, target="ort-cuda")
    assert op_counts(result.model) == {"MatMul": 1, SLN: 1}
    assert len(fused_node(result.model, SLN).input) == 5
    for seq in (1, 4):
        assert_equivalent(model, result.model, dims={"seq": seq})


@pytest.mark.parametrize("passes, kw, reason", [
    (("skip-layer-norm",), {"skip_shape": (5, HIDDEN)}, "the shapes must be known and equal"),
    (("skip-layer-norm",), {"x_shape": ("batch", 2, 5, HIDDEN)}, "takes rank 2 or 3"),
    (("skip-layer-norm",), {"x_shape": ("batch", 4, 4), "axis": -2, "gamma_shape": (4, 4)}, "normalizes the last only"),
    (("skip-layer-norm",), {"stats": True}, "also outputs its statistics"),
    (("skip-simplified-layer-norm",), {"norm": "rmsnorm", "opset": 23, "x_shape": ("batch", 2, 5, HIDDEN)},
     "takes rank 2 or 3"),
], ids=["skip-broadcasts", "rank-4", "two-axes", "statistics-output", "simplified-rank-4"])
def test_near_miss(tmp_path, passes, kw, reason):
    model = residual_norm(**kw)
    result = run(model, tmp_path, passes)
    assert not result.report.fusions and signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == passes[-1]]
    assert reason in miss


def test_gamma_computed_at_run_time_with_another_shape(tmp_path):
    b = GraphBuilder(opset=17)
    total = b.op("Add", b.input("x", ["batch", 5, HIDDEN]), b.input("skip", ["batch", 5, HIDDEN]))
    y = b.op("LayerNormalization", total, b.input("gamma", [1, HIDDEN]), epsilon=1e-5)
    model = b.build(y, output_names=["y"])
    result = run(model, tmp_path, ("skip-layer-norm",))
    assert not result.report.fusions
    (miss,) = [m.reason for m in result.report.near_misses]
    assert "'gamma' is computed at run time with shape [1, 16], not exactly [16]" in miss


def test_float64_has_no_kernel(tmp_path):
    b = GraphBuilder(opset=17)
    total = b.op("Add", b.input("x", [2, HIDDEN], TensorProto.DOUBLE), b.input("skip", [2, HIDDEN], TensorProto.DOUBLE))
    y = b.op("LayerNormalization", total, b.const(np.ones(HIDDEN)), epsilon=1e-5)
    result = run(b.build(y, output_names=["y"]), tmp_path, ("skip-layer-norm",))
    assert not result.report.fusions
    (miss,) = [m.reason for m in result.report.near_misses]
    assert "SkipLayerNormalization has no float64 kernel on onnxruntime's CUDA provider" in miss


@pytest.mark.parametrize("name", ["skip-layer-norm", "skip-simplified-layer-norm"])
def test_only_for_the_cuda_target(tmp_path, name):
    """Measured 6.6x slower than Add + Add + LayerNormalization on onnxruntime's CPU provider."""
    assert name in pipeline_for("ort-cuda")
    assert name not in pipeline_for("ort-cpu") and name not in pipeline_for("ort")
    assert name not in pipeline_for("onnx")
    with pytest.raises(UsageError, match="cannot run"):
        run(residual_norm(), tmp_path, (name,), target="onnx")
