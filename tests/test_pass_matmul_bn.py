"""matmul-bn: BatchNormalization after Gemm or a rank-2 MatMul folds into a Gemm."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

K, N = 5, 6


def linear_bn(op: str = "MatMul", *, x_shape=("batch", K), c_shape=None, opset: int = 17, bn_attrs=None,
              dtype=np.float32, weight=None, **gemm_attrs) -> onnx.ModelProto:
    """x -> MatMul/Gemm -> BatchNormalization over the N output features."""
    b = GraphBuilder(opset=opset)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", list(x_shape), elem)
    w_shape = (N, K) if gemm_attrs.get("transB") else (K, N)
    w = weight or b.const(b.rand(*w_shape, dtype=dtype), name="w")
    if op == "Gemm":
        c = [b.const(b.rand(*c_shape, dtype=dtype), name="c")] if c_shape is not None else []
        y = b.op("Gemm", x, w, *c, name="linear", **gemm_attrs)
    else:
        y = b.op("MatMul", x, w, name="linear")
    params = [b.rand(N, low=0.5, high=1.5), b.rand(N), b.rand(N), b.rand(N, low=0.5, high=2.0)]
    names = ("gamma", "beta", "mean", "var")
    out = b.op("BatchNormalization", y, *(b.const(p.astype(dtype), name=k) for p, k in zip(params, names)),
               name="bn", epsilon=1e-3, **(bn_attrs or {}))
    return b.build(out, output_names=["y"])


POSITIVE = {
    "matmul": ("MatMul", {}),
    "gemm-no-c": ("Gemm", {}),
    "gemm-c-N": ("Gemm", {"c_shape": (N,)}),
    "gemm-c-1N-transB": ("Gemm", {"c_shape": (1, N), "transB": 1}),
    "gemm-c-scalar-alpha-beta": ("Gemm", {"c_shape": (), "alpha": 0.5, "beta": 2.0}),
    "gemm-c-M1-transA": ("Gemm", {"c_shape": (3, 1), "transA": 1, "x_shape": (K, 3)}),
    "gemm-c-MN-all": ("Gemm", {"c_shape": (3, N), "transB": 1, "alpha": -1.5, "beta": 0.25, "x_shape": (3, K)}),
}


@pytest.mark.parametrize("case", POSITIVE)
def test_folds_into_gemm(tmp_path, case):
    op, kw = POSITIVE[case]
    model = linear_bn(op, **kw)
    result = optimize_model(model, tmp_path, passes=("matmul-bn",))
    assert op_counts(result.model) == {"Gemm": 1}
    symbolic = "batch" in kw.get("x_shape", ("batch",))
    for batch in ((1, 3) if symbolic else (None,)):
        assert_equivalent(model, result.model, dims={"batch": batch} if batch else None)
    assert not optimize_model(result.model, tmp_path, name="again", passes=("matmul-bn",)).report.fusions


def test_fp16_matmul_folds_in_float64(tmp_path):
    model = linear_bn(dtype=np.float16)
    result = optimize_model(model, tmp_path, passes=("matmul-bn",))
    assert op_counts(result.model) == {"Gemm": 1}
    p = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    s = p["gamma"] / np.sqrt(p["var"] + float(np.float32(1e-3)))
    folded = numpy_helper.to_array(next(t for t in result.model.graph.initializer
                                        if t.name == result.model.graph.node[0].input[1]))
    np.testing.assert_array_equal(folded, (p["w"] * s).astype(np.float16))
    # fp16: the unfused graph rounds the MatMul output to fp16 before BN
    assert_equivalent(model, result.model, dims={"batch": 2}, rtol=1e-2, atol=1e-2)


NEAR_MISSES = {
    "rank3-matmul": ({"x_shape": ("batch", N, K)},
                     "output has rank 3: bn normalizes its axis 1, not the feature axis 2"),
    "unknown-rank": ({"x_shape": None}, "rank of linear's input is unknown"),
    "weight-is-input": ({"weight": "w_in"}, "'w_in' is a graph input, not a constant"),
    "training-mode": ({"bn_attrs": {"training_mode": 1}}, "training mode"),
    "opset6": ({"opset": 6, "bn_attrs": {"is_test": 1}}, "needs opset 7"),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss(tmp_path, case):
    kw, reason = NEAR_MISSES[case]
    model = linear_bn(**kw) if kw.get("x_shape", ()) is not None else _unknown_rank_model()
    if kw.get("weight"):
        model.graph.input.append(onnx.helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [K, N]))
    result = optimize_model(model, tmp_path, passes=("matmul-bn",))
    assert not result.report.fusions
    assert op_counts(result.model) == op_counts(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "matmul-bn"]
    assert reason in miss


def _unknown_rank_model() -> onnx.ModelProto:
    model = linear_bn()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    return model


def test_linear_with_bias_then_bn_becomes_one_gemm_in_the_default_pipeline(tmp_path):
    # torch exports Linear + BatchNorm1d as MatMul + Add(bias) + BN: matmul-add makes the Gemm
    # (later in the pipeline), and the next round folds the BN into it
    b = GraphBuilder()
    y = b.op("Add", b.const(b.rand(N)), b.op("MatMul", b.input("x", ["batch", K]), b.const(b.rand(K, N))))
    params = [b.rand(N, low=0.5, high=1.5), b.rand(N), b.rand(N), b.rand(N, low=0.5, high=2.0)]
    model = b.build(b.op("BatchNormalization", y, *(b.const(p) for p in params)), output_names=["y"])
    result = optimize_model(model, tmp_path)
    assert op_counts(result.model) == {"Gemm": 1}
    assert [f.pass_name for f in result.report.fusions] == ["matmul-add", "matmul-bn"]
    for batch in (1, 4):
        assert_equivalent(model, result.model, dims={"batch": batch})
