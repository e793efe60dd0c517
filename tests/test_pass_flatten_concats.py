"""flatten-concats: Concat(a, Concat(b, c), d) on one axis -> Concat(a, b, c, d)."""

from __future__ import annotations

import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("flatten-concats",)


def nested(inner_axis=1, outer_axis=1, *, inner_read_elsewhere=False, twice=False):
    """Inception-like branches: Relu outputs [batch, C_i, 4, 4] concatenated on channels."""
    b = GraphBuilder()
    x = b.input("x", ["batch", 2, 4, 4])
    wide = b.input("w", ["batch", 2, 8, 4])  # the outer pieces when the inner Concat doubles axis 2
    branches = [b.op("Relu", b.op("Neg", wide if i in (0, 3) and inner_axis == 2 else x)) for i in range(4)]
    inner = b.op("Concat", branches[1], branches[2], axis=inner_axis, name="inner")
    pieces = [branches[0], inner, branches[3]] + ([inner] if twice else [])
    outputs = [b.op("Concat", *pieces, axis=outer_axis, name="outer")]
    if inner_read_elsewhere:
        outputs.append(b.op("Sigmoid", inner))
    return b.build(*outputs, output_names=["y", "z"][: len(outputs)])


@pytest.mark.parametrize("inner_axis, outer_axis", [(1, 1), (-3, 1), (1, -3)], ids=["same", "negative-inner",
                                                                                     "negative-outer"])
def test_flattened(tmp_path, inner_axis, outer_axis):
    model = nested(inner_axis, outer_axis)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model)["Concat"] == 1
    (concat,) = [n for n in result.model.graph.node if n.op_type == "Concat"]
    assert len(concat.input) == 4
    for dims in ({"batch": 2}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("kw", [{"inner_axis": 2}, {"inner_read_elsewhere": True}, {"twice": True}],
                         ids=["other-axis", "inner-read-elsewhere", "inner-read-twice"])
def test_kept_silently(tmp_path, kw):
    model = nested(**kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses
