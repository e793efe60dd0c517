"""eliminate-noop-layout: layout operators that return x unchanged go; any that change x stay, silently."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("eliminate-noop-layout",)
I64 = np.int64
BIG = np.iinfo(np.int64).max


def layout(op, *constants, opset=17, x_shape=("batch", 3, 4), **attrs):
    """Abs(x) -> op(., constants...) named "layout" -> Neg -> y."""
    b = GraphBuilder(opset=opset)
    t = b.op("Abs", b.input("x", list(x_shape)))
    args = [b.const(np.asarray(c, I64)) if c is not None else "" for c in constants]
    return b.build(b.op("Neg", b.op(op, t, *args, name="layout", **attrs)), output_names=["y"])


NOOPS = {
    "concat-one-input": lambda: layout("Concat", axis=1),
    "tile-ones": lambda: layout("Tile", [1, 1, 1]),
    "pad-zeros": lambda: layout("Pad", [0] * 6),
    "pad-zeros-reflect": lambda: layout("Pad", [0] * 6, mode="reflect"),
    "pad-attr-opset10": lambda: layout("Pad", opset=10, pads=[0] * 6),
    "slice-to-int64-max": lambda: layout("Slice", [0], [BIG], [0]),
    "slice-static-end": lambda: layout("Slice", [0, -9], [3, 4], [1, 2]),
    "slice-with-steps": lambda: layout("Slice", [0], [BIG], [-1], [1]),
    "slice-attrs-opset9": lambda: layout("Slice", opset=9, starts=[0], ends=[3], axes=[1]),
    "expand-ones": lambda: layout("Expand", [1, 1]),
    "expand-same-static": lambda: layout("Expand", [3, 4]),
    "expand-lower-rank": lambda: layout("Expand", [4]),
    "reshape-to-own-shape": lambda: layout("Reshape", [0, 3, 4]),
    "reshape-minus-one-is-batch": lambda: layout("Reshape", [-1, 3, 4]),  # inference names the -1 batch
}


@pytest.mark.parametrize("case", NOOPS)
def test_removed(tmp_path, case):
    model = NOOPS[case]()
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Abs": 1, "Neg": 1}
    for dims in ({"batch": 2}, {"batch": 5}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


NOT_NOOPS = {  # each changes x: not this pattern, so neither a rewrite nor a near-miss
    "tile-twice": lambda: layout("Tile", [1, 2, 1]),
    "pad-one": lambda: layout("Pad", [0, 0, 1, 0, 0, 0]),
    "slice-from-1": lambda: layout("Slice", [1], [BIG], [0]),
    "slice-end-short": lambda: layout("Slice", [0], [2], [1]),
    "slice-symbolic-end": lambda: layout("Slice", [0], [3], [0]),  # batch may exceed 3
    "slice-step-2": lambda: layout("Slice", [0], [BIG], [2], [2]),
    "expand-grows": lambda: layout("Expand", [2, 3, 4], x_shape=(1, 3, 4)),
    "expand-over-symbolic": lambda: layout("Expand", [5, 3, 4]),  # batch is not known to be 5
    "expand-higher-rank": lambda: layout("Expand", [1, 1, 1, 1]),
    "tile-runtime-repeats": lambda: _runtime_repeats(),
    "reshape-reorders": lambda: layout("Reshape", [0, 4, 3]),
}


def _runtime_repeats():
    b = GraphBuilder()
    t = b.op("Abs", b.input("x", ["batch", 3]))
    return b.build(b.op("Tile", t, b.op("Shape", b.input("r", [1, 1]))), output_names=["y"])


@pytest.mark.parametrize("case", NOT_NOOPS)
def test_kept_silently(tmp_path, case):
    model = NOT_NOOPS[case]()
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses


def test_graph_output_fed_by_graph_input_is_a_near_miss(tmp_path):
    b = GraphBuilder()
    model = b.build(b.op("Concat", b.input("x", ["batch", 3]), name="layout", axis=0), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    (miss,) = result.report.near_misses
    assert "is a graph output fed directly by 'x', which is a graph input" in miss.reason
