"""reshape-around-elementwise: x -> Reshape -> elementwise ops -> Reshape back to x's shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import assert_equivalent, fused_and_settled, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASS = ("reshape-around-elementwise",)
# distinct sizes for the distinct symbols, in both settings
DIMS = ({"batch": 2, "sequence": 3}, {"batch": 5, "sequence": 7})
HIDDEN = 8


def gpt2_mlp(*, back=(-1, 4 * HIDDEN), constant=None, reader=False, residual=False, sequence="sequence"):
    """torch dynamo's GPT-2 MLP: x [B*S, D] -> Gemm -> Reshape [B, S, 4D] -> tanh GELU ->
    Reshape back -> Gemm. `constant` replaces GELU's 0.5; `reader` also outputs the first view;
    `residual` adds the graph input's view into the GELU (a second entry)."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", sequence, HIDDEN])
    flat = b.op("Reshape", x, b.const([-1, HIDDEN], dtype=np.int64))
    h = b.op("Gemm", flat, b.const(b.rand(HIDDEN, 4 * HIDDEN)), b.const(b.rand(4 * HIDDEN)))
    shape = b.op("Concat", b.op("Shape", x, end=2), b.const([4 * HIDDEN], dtype=np.int64), axis=0)
    y = b.op("Reshape", h, shape, name="first")
    half = b.const(0.5 if constant is None else constant)
    cube = b.op("Mul", b.op("Pow", y, b.const(3.0)), b.const(0.044715))
    inner = b.op("Mul", b.op("Add", y, cube), b.const(math.sqrt(2 / math.pi)))
    gate = b.op("Add", b.op("Tanh", inner), b.const(1.0))
    if residual:
        gate = b.op("Add", gate, b.op("Reshape", b.op("Tile", x, b.const([1, 1, 4], dtype=np.int64)), shape))
    z = b.op("Mul", b.op("Mul", y, half), gate)
    out = b.op("Reshape", z, b.const(list(back), dtype=np.int64), name="back")
    w = b.op("Gemm", out, b.const(b.rand(4 * HIDDEN, HIDDEN)))
    outputs = [b.op("Reshape", w, b.op("Shape", x))]
    if reader:
        outputs.append(b.op("Relu", y))
    return b.build(*outputs, output_names=["y", "view"][: len(outputs)])


def fused(tmp_path, model):
    return fused_and_settled(model, tmp_path, PASS, DIMS)


def test_both_views_go(tmp_path):
    model = gpt2_mlp()
    result = fused(tmp_path, model)
    assert op_counts(result.model)["Reshape"] == op_counts(model)["Reshape"] - 2
    # the GELU's first node reads the Gemm's output directly
    gemm = next(n for n in result.model.graph.node if n.op_type == "Gemm")
    assert {n.op_type for n in result.model.graph.node if gemm.output[0] in n.input} == {"Pow", "Add", "Mul"}
    (record,) = result.report.fusions
    assert record.pass_name == PASS[0] and "first" in record.replaced and "back" in record.replaced


def test_first_view_stays_for_its_other_reader(tmp_path):
    model = gpt2_mlp(reader=True)
    result = fused(tmp_path, model)
    assert op_counts(result.model)["Reshape"] == op_counts(model)["Reshape"] - 1
    assert "first" in {n.name for n in result.model.graph.node}


def test_rank_one_constant_of_one_element(tmp_path):
    fused(tmp_path, gpt2_mlp(constant=[0.5]))


@pytest.mark.parametrize("case", ["per-position-constant", "other-shape", "second-entry", "wide-constant"])
def test_not_this_pattern(tmp_path, case):
    model = {
        # a scale per position of the view's axis 1: on x ([B*3, 4D]) it would broadcast wrongly
        "per-position-constant": lambda: gpt2_mlp(sequence=3, constant=np.arange(3, dtype=np.float32).reshape(3, 1)),
        # the second view is not x's shape ([B*S*2, 2D])
        "other-shape": lambda: gpt2_mlp(back=(-1, 2 * HIDDEN)),
        # the GELU also reads the graph input's own view
        "second-entry": lambda: gpt2_mlp(residual=True),
        # declined though it would be right here (x keeps the last axis): constants of one
        # element only, no per-axis reasoning
        "wide-constant": lambda: gpt2_mlp(constant=np.full(4 * HIDDEN, 0.5, np.float32)),
    }[case]()
    result = optimize_model(model, tmp_path, passes=PASS)
    assert not result.report.fusions
    assert signature(result.model) == signature(model)


def test_in_the_default_pipeline(tmp_path):
    model = gpt2_mlp()
    result = optimize_model(model, tmp_path)
    assert any(r.pass_name == PASS[0] for r in result.report.fusions)
    for dims in DIMS:
        assert_equivalent(model, result.model, dims=dims)
