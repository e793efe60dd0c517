"""eliminate-empty-concat-inputs: Concat inputs with a static 0 along the axis go; nothing else does."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("eliminate-empty-concat-inputs", "eliminate-noop-layout")
BIG = np.iinfo(np.int64).max


def concat(order: str, *, start: int = 4, axis: int = 2):
    """Abs(x [batch, 3, 4]) concatenated with pieces named by `order`: "a" Abs(x), "b" Neg(x),
    "e" x[..., start:] on `axis` (empty on axis 2 from 4 on), then Sigmoid -> y."""
    b = GraphBuilder()
    x = b.input("x", ["batch", 3, 4])
    ints = lambda *v: b.const(np.array(v, np.int64))  # noqa: E731
    pieces = {"a": lambda: b.op("Abs", x), "b": lambda: b.op("Neg", x),
              "e": lambda: b.op("Slice", x, ints(start), ints(BIG), ints(axis))}
    return b.build(b.op("Sigmoid", b.op("Concat", *(pieces[c]() for c in order), axis=-1, name="concat")),
                   output_names=["y"])


@pytest.mark.parametrize("order, left", [("ae", 0), ("ea", 0), ("aeb", 2), ("eae", 0)])
def test_empty_inputs_dropped(tmp_path, order, left):
    model = concat(order)
    result = optimize_model(model, tmp_path, passes=PASSES)
    counts = op_counts(result.model)
    assert counts.get("Concat", 0) == (1 if left else 0) and "Slice" not in counts, counts
    for dims in ({"batch": 2}, {"batch": 5}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("kw", [{"start": 2}, {"start": 3, "axis": 0}], ids=["not-empty", "symbolic-axis"])
def test_inputs_that_may_hold_elements_stay(tmp_path, kw):
    # x[..., 2:] holds two columns; x[3:] along batch is empty only while batch <= 3: a symbol is never 0
    model = concat("ae", **kw) if "axis" not in kw else _batch_slice()
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses


def _batch_slice():
    b = GraphBuilder()
    x = b.input("x", ["batch", 3, 4])
    tail = b.op("Slice", x, b.const(np.array([3], np.int64)), b.const(np.array([BIG], np.int64)),
                b.const(np.array([0], np.int64)))
    return b.build(b.op("Concat", b.op("Abs", x), tail, axis=0), output_names=["y"])


def test_all_inputs_empty_stays(tmp_path):
    model = concat("ee")
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model)["Concat"] == 1
