"""matmul-add-into-view: MatMul + bias Add read only by a Reshape -> Gemm over the rows."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tests.conftest import assert_equivalent, fused_and_settled, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASS = ("matmul-add-into-view",)
WITH_CSE = (*PASS, "eliminate-common-subexpressions")
# distinct sizes for the distinct symbols, in both settings
DIMS = ({"batch": 2, "sequence": 3}, {"batch": 5, "sequence": 7})
HIDDEN, HEADS, HEAD_SIZE = 8, 2, 4


def projections(*, count=3, shape="dims", opset=17, other_reader=False, viewed_input=False):
    """Q/K/V-style projections of x [batch, sequence, HIDDEN], each split into heads by a Reshape.

    shape: "dims" (dynamo: the batch and sequence read at run time from the token ids, a second
    input [batch, sequence], then -1 and the head size), "dims-heads" (the same, then the head
    count and size), "constant" ([-1, 3, heads, size], x's sequence static 3), "zeros"
    (TorchScript's [0, 0, heads, size]), "unproven" (the sequence entry read from another input's
    dim `length`), "projection" (the shape read from the projection itself). viewed_input: x comes
    from a Reshape of the graph input, which the projection alone reads."""
    b = GraphBuilder(opset=opset)
    sequence = 3 if shape == "constant" else "sequence"
    if viewed_input:
        z = b.input("z", ["batch", sequence, HEADS, HEAD_SIZE])
        x = b.op("Reshape", z, b.const([0, 0, HIDDEN], dtype=np.int64))
    else:
        x = b.input("x", ["batch", sequence, HIDDEN])
    ids = b.input("ids", ["batch", "sequence"], TensorProto.INT64) if shape.startswith("dims") else None
    other = b.input("other", ["length", "sequence"]) if shape == "unproven" else None
    heads = b.const([HEADS, HEAD_SIZE], dtype=np.int64)
    outputs = []
    for i in range(count):
        y = b.op("Add", b.op("MatMul", x, b.const(b.rand(HIDDEN, HIDDEN))), b.const(b.rand(HIDDEN)), name=f"bias{i}")
        if shape == "dims":  # as torch's dynamo export writes view(batch, sequence, -1, size)
            target = b.op("Concat", b.op("Shape", ids, end=1), b.op("Shape", ids, start=1, end=2),
                          b.const([-1], dtype=np.int64), b.const([HEAD_SIZE], dtype=np.int64), axis=0)
        elif shape == "dims-heads":  # view(batch, sequence, heads, size)
            target = b.op("Concat", b.op("Shape", ids), heads, axis=0)
        elif shape == "constant":
            target = b.const([-1, 3, HEADS, HEAD_SIZE], dtype=np.int64)
        elif shape == "zeros":
            target = b.const([0, 0, HEADS, HEAD_SIZE], dtype=np.int64)
        elif shape == "unproven":
            target = b.op("Concat", b.op("Shape", x, end=1), b.op("Shape", other, end=1), heads, axis=0)
        else:  # "projection"
            target = b.op("Concat", b.op("Shape", y, end=2), heads, axis=0)
        outputs.append(b.op("Reshape", y, target, name=f"view{i}"))
        if other_reader and i == 0:
            outputs.append(b.op("Relu", y))
    return b.build(*outputs)


def fused(tmp_path, model, passes=PASS):
    return fused_and_settled(model, tmp_path, passes, DIMS, rerun=PASS)


def test_projections_share_the_rows(tmp_path):
    model = projections()
    result = fused(tmp_path, model, passes=WITH_CSE)
    counts, before = op_counts(result.model), op_counts(model)
    assert counts["Gemm"] == 3 and counts["Add"] == 0 and counts["MatMul"] == 0
    # one Reshape of x to its rows for the three projections: two nodes fewer than before
    assert counts["Reshape"] == before["Reshape"] + 1
    assert counts["Gemm"] + counts["Reshape"] == before["MatMul"] + before["Add"] + before["Reshape"] - 2
    records = [r for r in result.report.fusions if r.pass_name == PASS[0]]
    assert len(records) == 3 and all("view0" in r.replaced or "view1" in r.replaced or "view2" in r.replaced
                                     for r in records)
    # the head split reads the batch and sequence at run time: a 0 there is a 0 (allowzero)
    views = [n for n in result.model.graph.node if n.name.startswith("view")]
    assert len(views) == 3 and all(helper.get_attribute_value(a) == 1 for n in views for a in n.attribute
                                   if a.name == "allowzero")
    assert all(any(a.name == "allowzero" for a in n.attribute) for n in views)


def test_constant_target_shape_keeps_its_attributes(tmp_path):
    result = fused(tmp_path, projections(shape="constant"))
    assert op_counts(result.model)["Gemm"] == 3
    views = [n for n in result.model.graph.node if n.name.startswith("view")]
    assert views and not any(a.name == "allowzero" for n in views for a in n.attribute)


def test_lone_projection_behind_a_view(tmp_path):
    """x is a view read only by the projection: the Reshape to rows merges into it."""
    model = projections(count=1, viewed_input=True)
    result = fused(tmp_path, model, passes=(*PASS, "fuse-reshapes"))
    assert op_counts(result.model)["Gemm"] == 1
    assert sum(op_counts(result.model).values()) <= sum(op_counts(model).values()) - 1


@pytest.mark.parametrize("shape", ["dims", "dims-heads"])
def test_empty_sequence_gives_what_the_original_gives(tmp_path, shape):
    """A sequence of 0: the head split's runtime entry is a 0, which allowzero keeps a 0, as the
    original's copy of y's dim gave ([B, 0, H, d]). Beside a -1 the original fails (0 elements
    over a 0 product: no value for the -1); the rewrite, exact wherever the original runs, may
    then give an empty tensor."""
    model = projections(count=2, shape=shape)
    result = optimize_model(model, tmp_path, passes=PASS)
    assert op_counts(result.model)["Gemm"] == 2
    feeds = {"x": np.zeros((2, 0, HIDDEN), np.float32), "ids": np.zeros((2, 0), np.int64)}

    def run(model):
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        try:
            return [o.shape for o in session.run(None, feeds)]
        except Exception as exc:  # onnxruntime's Fail: compared by kind, not message
            return type(exc).__name__

    expected, got = run(model), run(result.model)
    if shape == "dims-heads":
        assert expected == got == [(2, 0, HEADS, HEAD_SIZE)] * 2
    else:
        assert expected == "Fail" and (got == "Fail" or all(0 in s for s in got))


@pytest.mark.parametrize("case, reason", [
    ("zeros", "a 0 entry"),
    ("unproven", "not provably"),
    ("opset13", "allowzero (opset 14)"),
])
def test_declines_with_a_reason(tmp_path, case, reason):
    model = (projections(shape="dims", opset=13) if case == "opset13" else projections(shape=case))
    result = optimize_model(model, tmp_path, passes=PASS)
    assert not result.report.fusions
    assert signature(result.model) == signature(model)
    misses = [m for m in result.report.near_misses if m.pass_name == PASS[0]]
    assert misses and all(reason in m.reason for m in misses), [m.reason for m in misses]


def test_shape_computed_from_the_projection(tmp_path):
    """The head split's shape reads the projection: the rewrite would remove what it reads."""
    model = projections(shape="projection", count=1, viewed_input=True)
    result = optimize_model(model, tmp_path, passes=PASS)
    assert not result.report.fusions and signature(result.model) == signature(model)
    assert [m.reason for m in result.report.near_misses if m.pass_name == PASS[0]] == [
        "view0's target shape is computed from the projection (Shape_1 reads it), which the rewrite removes"]


def test_lone_projection_is_not_this_pattern(tmp_path):
    """Its Reshape of x would cost the node its Add saves: silent, nothing changed."""
    model = projections(count=1)
    result = optimize_model(model, tmp_path, passes=PASS)
    assert not result.report.fusions and not result.report.near_misses
    assert signature(result.model) == signature(model)


def test_projection_read_as_is_keeps_its_add(tmp_path):
    """The first projection is also read as [B, S, N]: it stays MatMul + Add; the other two fuse."""
    model = projections(other_reader=True)
    result = fused(tmp_path, model)
    counts = op_counts(result.model)
    assert counts["Gemm"] == 2 and counts["MatMul"] == 1 and counts["Add"] == 1
    stayed = next(n for n in result.model.graph.node if n.op_type == "Add")
    assert stayed.name == "bias0"


def test_rank_two_is_matmul_adds(tmp_path):
    b = GraphBuilder(opset=17)
    x = b.input("x", ["rows", HIDDEN])
    outs = [b.op("Reshape", b.op("Add", b.op("MatMul", x, b.const(b.rand(HIDDEN, HIDDEN))), b.const(b.rand(HIDDEN))),
                 b.const([-1, HEADS, HEAD_SIZE], dtype=np.int64)) for _ in range(2)]
    model = b.build(*outs)
    assert not optimize_model(model, tmp_path, passes=PASS).report.fusions


def test_in_the_default_pipeline(tmp_path):
    """After static-reshape-shape, which makes a head split that reads x's own dims [0, 0, H, d]
    (nodes fewer than this pass saves, and then this pass declines: the rows have no such dims)."""
    model = projections(shape="constant")
    result = optimize_model(model, tmp_path)
    assert any(r.pass_name == PASS[0] for r in result.report.fusions)
    assert op_counts(result.model)["Add"] == 0
    for dims in DIMS:
        assert_equivalent(model, result.model, dims=dims)
    assert TensorProto.FLOAT == result.model.graph.output[0].type.tensor_type.elem_type
