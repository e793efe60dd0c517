"""fused-matmul: Transpose of a MatMul input and a scalar Mul -> com.microsoft FusedMatMul."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for, resolve
from fuse_cli.verify import verify_models
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

PASSES = ("fused-matmul",)
FUSED = {"com.microsoft::FusedMatMul": 1}


def run(model, tmp_path, target="ort-cpu", name="model"):
    return optimize_model(model, tmp_path, target=target, passes=PASSES, name=name)


def fused_attrs(model) -> dict:
    (node,) = [n for n in model.graph.node if n.op_type == "FusedMatMul"]
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def attention_scores(b, scale_first=False, scale=np.float32(0.125), scale_shape=()):
    """Q @ K^T * scale over [batch, heads, seq, dim]."""
    q, k = b.input("q", ["batch", 2, 5, 4]), b.input("k", ["batch", 2, 5, 4])
    mm = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))
    s = b.const(np.full(scale_shape, scale, dtype=np.asarray(scale).dtype))
    return b.build(b.op("Mul", *((s, mm) if scale_first else (mm, s))), output_names=["y"])


def transposed(b, a_shape, b_shape, perm_a=None, perm_b=None):
    """MatMul(A', B') with A' and/or B' a Transpose (perm None: no Transpose; () : perm omitted)."""
    a, w = b.input("a", a_shape), b.input("w", b_shape)
    if perm_a is not None:
        a = b.op("Transpose", a, **({"perm": list(perm_a)} if perm_a else {}))
    if perm_b is not None:
        w = b.op("Transpose", w, **({"perm": list(perm_b)} if perm_b else {}))
    return b.build(b.op("MatMul", a, w), output_names=["y"])


def _scaled_only(b, dtype=TensorProto.FLOAT, scale=0.25):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    mm = b.op("MatMul", b.input("a", ["m", 3, 8], dtype), b.const(b.rand(8, 6, dtype=np_dtype)))
    return b.build(b.op("Mul", mm, b.const(np.asarray(scale, np_dtype))), output_names=["y"])


POSITIVES = {  # builder, expected FusedMatMul attributes
    "scores-scale-right": (lambda b: attention_scores(b), {"transB": 1, "alpha": 0.125}),
    "scores-scale-left": (lambda b: attention_scores(b, scale_first=True, scale_shape=(1,)),
                          {"transB": 1, "alpha": 0.125}),
    "transB-2d": (lambda b: transposed(b, ["m", 8], [6, 8], perm_b=(1, 0)), {"transA": 0, "transB": 1}),
    "transA-perm-omitted": (lambda b: transposed(b, [8, "m"], [8, 6], perm_a=()), {"transA": 1, "transB": 0}),
    "both-3d-broadcast": (lambda b: transposed(b, ["m", 8, 5], [6, 8], perm_a=(0, 2, 1), perm_b=(1, 0)),
                          {"transA": 1, "transB": 1}),
    "transB-vector-a": (lambda b: transposed(b, [8], ["m", 8], perm_b=(1, 0)), {"transA": 0, "transB": 1}),
    "scale-only": (_scaled_only, {"transA": 0, "transB": 0, "alpha": 0.25}),
    "scale-only-float64": (lambda b: _scaled_only(b, TensorProto.DOUBLE, 0.125), {"alpha": 0.125}),
}


@pytest.mark.parametrize("kind", POSITIVES)
def test_fuses(tmp_path, kind):
    build, expected = POSITIVES[kind]
    model = build(GraphBuilder())
    result = run(model, tmp_path)
    assert op_counts(result.model) == FUSED, result.report.near_misses
    attrs = fused_attrs(result.model)
    assert {k: attrs[k] for k in expected} == expected
    for dims in ({"batch": 1, "m": 1}, {"batch": 3, "m": 4}):
        assert_equivalent(model, result.model, dims=dims)
    assert not run(result.model, tmp_path, name="again").report.fusions


def test_ort_and_cuda_targets_run_it_but_not_onnx(tmp_path):
    assert all("fused-matmul" in pipeline_for(t) for t in ("ort", "ort-cpu", "ort-cuda"))
    assert "fused-matmul" not in pipeline_for("onnx")
    with pytest.raises(UsageError, match="cannot run"):
        resolve("onnx", PASSES)
    model = attention_scores(GraphBuilder())
    assert op_counts(run(model, tmp_path, target="ort").model) == FUSED


def test_float64_scale_must_be_exact_in_float32(tmp_path):
    model = _scaled_only(GraphBuilder(), TensorProto.DOUBLE, 0.1)
    result = run(model, tmp_path)
    assert op_counts(result.model) == {"MatMul": 1, "Mul": 1}
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "fused-matmul"]
    assert "scales by 0.1, which FusedMatMul's float32 alpha cannot hold exactly" in miss
    # the refusal has teeth: the float32-rounded alpha costs float32 precision (1.5e-8 relative),
    # while an exact alpha agrees to float64 rounding
    forced = _scaled_only(GraphBuilder(), TensorProto.DOUBLE, 0.1)
    mm, mul = forced.graph.node
    forced.graph.node.remove(mul)
    mm.CopyFrom(helper.make_node("FusedMatMul", list(mm.input), list(mul.output), domain="com.microsoft", alpha=0.1))
    forced.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert not verify_models(model, forced, dims={"m": 2}, rtol=1e-12, atol=0).passed
    exact = _scaled_only(GraphBuilder(), TensorProto.DOUBLE, 0.125)
    assert verify_models(exact, run(exact, tmp_path, name="exact").model, dims={"m": 2}, rtol=1e-12, atol=0).passed


def _fp16(b):
    return b.build(b.op("MatMul", b.input("a", [3, 8], TensorProto.FLOAT16),
                        b.op("Transpose", b.input("w", [6, 8], TensorProto.FLOAT16), perm=[1, 0])),
                   output_names=["y"])


def test_fp16_fuses_where_the_cpu_ran_the_matmul_in_float32(tmp_path):
    model = _fp16(GraphBuilder())
    result = run(model, tmp_path)
    assert op_counts(result.model) == FUSED and fused_attrs(result.model)["transB"] == 1
    assert_equivalent(model, result.model)


def _shared_transpose(b):
    t = b.op("Transpose", b.input("x", [4, 4]), perm=[1, 0])
    return b.build(b.op("MatMul", t, t), output_names=["y"])


def _read_elsewhere(b):
    t = b.op("Transpose", b.input("w", [6, 8]), perm=[1, 0])
    return b.build(b.op("MatMul", b.input("a", [3, 8]), t), b.op("Neg", t, name="reader"), output_names=["y", "n"])


def _widening_scale(b):
    mm = b.op("MatMul", b.input("a", [3, 8]), b.const(b.rand(8, 6)))
    return b.build(b.op("Mul", mm, b.const(np.full((1, 1, 1), 0.5, np.float32))), output_names=["y"])


NEGATIVES = {
    "batch-axis-perm": (lambda b: transposed(b, [2, 3, 8], [8, 6], perm_a=(1, 0, 2)),
                        "Transpose_1 has perm [1, 0, 2]; FusedMatMul absorbs only a swap of the last two axes"),
    # onnxruntime 1.31 CPU gives wrong values for FusedMatMul(A, b, transA=1) with a vector b
    "transA-vector-b": (lambda b: transposed(b, [8, 4], [8], perm_a=(1, 0)), "computes transA wrongly"),
    "perm-omitted-3d": (lambda b: transposed(b, [8, 3, 2], [8, 6], perm_a=()), "has perm [2, 1, 0]"),
    "read-elsewhere": (_read_elsewhere, "is also read by reader"),
    "shared-transpose": (_shared_transpose, "reads Transpose_1's output on both sides"),
    "widening-scale": (_widening_scale, "scale has rank 3, which may widen"),
}


@pytest.mark.parametrize("kind", NEGATIVES)
def test_declines_with_reason(tmp_path, kind):
    build, reason = NEGATIVES[kind]
    model = build(GraphBuilder())
    result = run(model, tmp_path)
    assert not result.report.fusions
    assert [n.op_type for n in result.model.graph.node] == [n.op_type for n in model.graph.node]
    misses = [m.reason for m in result.report.near_misses if m.pass_name == "fused-matmul"]
    assert misses and reason in misses[0], misses


@pytest.mark.parametrize("scale", [np.full((1, 6), 0.5, np.float32), None], ids=["per-column-mul", "plain-matmul"])
def test_not_the_pattern(tmp_path, scale):
    b = GraphBuilder()
    y = b.op("MatMul", b.input("a", [3, 8]), b.const(b.rand(8, 6)))
    model = b.build(b.op("Mul", y, b.const(scale)) if scale is not None else y, output_names=["y"])
    result = run(model, tmp_path)
    assert not result.report.fusions and not result.report.near_misses
