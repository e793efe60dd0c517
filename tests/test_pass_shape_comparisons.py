"""fold-shape-comparisons: torch's expand(b, -1, n) plumbing, decided where dims cannot be negative."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("fold-shape-comparisons", "fold-constants")


def expand_sizes(middle, *, compare_with=-1):
    """x[batch, 1, 4].expand(batch, middle, 4) as TorchScript writes it: sizes s = [batch, middle, 4],
    Where(s == -1, 1, s) -> Expand."""
    b = GraphBuilder(opset=14)
    x = b.input("x", ["batch", 1, 4])
    batch = b.op("Unsqueeze", b.op("Gather", b.op("Shape", x), b.const(np.array(0, np.int64)), axis=0),
                 b.const(np.array([0], np.int64)))
    s = b.op("Concat", batch, b.const(np.array([middle, 4], np.int64)), axis=0)
    minus = b.const(np.full(3, compare_with, np.int64))
    sizes = b.op("Where", b.op("Equal", s, minus, name="equal"), b.const(np.ones(3, np.int64)), s, name="where")
    return b.build(b.op("Expand", x, sizes), output_names=["y"])


@pytest.mark.parametrize("middle, kept", [(3, {}), (-1, {"Where": 1})], ids=["no-minus-one", "literal-minus-one"])
def test_decided(tmp_path, middle, kept):
    model = expand_sizes(middle)
    result = optimize_model(model, tmp_path, passes=PASSES)
    counts = op_counts(result.model)
    assert counts["Equal"] == 0 and counts["Where"] == kept.get("Where", 0)
    for dims in ({"batch": 2}, {"batch": 5}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


def test_dim_against_non_negative_constant_is_undecided(tmp_path):
    """batch == 2 depends on the input: kept, and silently (no pattern to report)."""
    model = expand_sizes(3, compare_with=2)
    result = optimize_model(model, tmp_path, passes=("fold-shape-comparisons",))
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses


def test_where_that_broadcasts_is_kept(tmp_path):
    b = GraphBuilder(opset=14)
    s = b.op("Shape", b.input("x", ["batch"]))  # [1] at run time
    cond = b.const(np.zeros(3, np.bool_), dtype=np.bool_)
    model = b.build(b.op("Where", cond, b.const(np.ones(3, np.int64)), s), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("fold-shape-comparisons",))
    assert signature(result.model) == signature(model)
