"""matmul-add: MatMul + constant bias Add -> Gemm, for rank-2 activations only."""

from __future__ import annotations

import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

# Pinned, so passes added to the default pipeline cannot change what these tests exercise.
PASSES = ("matmul-add",)


def matmul_add(x_shape=(3, 4), bias_shape=(5,), *, bias_first=False, bias_input=False, reader=False):
    """x[..., 4] @ W[4, 5] + bias, optionally Add(bias, MatMul) or with the MatMul output also read."""
    b = GraphBuilder()
    x = b.input("x", list(x_shape))
    mm = b.op("MatMul", x, b.const(b.rand(4, 5), name="w"))
    bias = b.input("bias", list(bias_shape)) if bias_input else b.const(b.rand(*bias_shape), name="bias")
    y = b.op("Add", *((bias, mm) if bias_first else (mm, bias)))
    extra = [b.op("Relu", mm, name="reader")] if reader else []
    return b.build(y, *extra, output_names=["y", "z"][: 1 + len(extra)])


@pytest.mark.parametrize("bias_first", [False, True], ids=["matmul-first", "bias-first"])
@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (1,), ()], ids=str)
def test_fuses_to_gemm(tmp_path, bias_shape, bias_first):
    model = matmul_add(bias_shape=bias_shape, bias_first=bias_first)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Gemm": 1}
    assert list(result.model.graph.node[0].input) == ["x", "w", "bias"]
    assert [o.name for o in result.model.graph.output] == ["y"]
    assert_equivalent(model, result.model)
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


@pytest.mark.parametrize("kw, reason", [
    ({"x_shape": (2, 3, 4)}, "activation has rank 3"),
    ({"bias_shape": (3, 5)}, "bias of shape [3, 5] does not broadcast over the last dimension"),
    ({"bias_input": True}, "'bias' is a graph input, not a constant"),
    ({"reader": True}, "is also read by reader"),
], ids=["rank3", "bias-MxN", "bias-input", "matmul-read-elsewhere"])
def test_near_miss(tmp_path, kw, reason):
    model = matmul_add(**kw)
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), "matmul-add", reason)


def test_activations_in_weight_or_bias_slots_are_not_the_pattern(tmp_path):
    """q @ k^T (a run-time weight) and a residual Add (a run-time bias) are no Linear layer: no
    near-miss for either, while a graph-input bias still is one (test_kept_with_reason)."""
    b = GraphBuilder()
    x = b.input("x", [3, 4])
    k = b.op("Relu", b.input("k", [4, 4]))
    scores = b.op("MatMul", x, k)  # weight computed at run time
    residual = b.op("Add", scores, b.op("Neg", x))
    linear = b.op("MatMul", residual, b.const(b.rand(4, 4)))
    model = b.build(b.op("Add", linear, b.op("Sigmoid", x)), output_names=["y"])  # bias computed at run time
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions and not result.report.near_misses
