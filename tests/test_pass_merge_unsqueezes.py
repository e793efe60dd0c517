"""merge-unsqueezes: Unsqueeze(Unsqueeze(x, a), b) -> Unsqueeze(x, c) (BERT's mask[:, None, None, :])."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

PASSES = ("merge-unsqueezes",)


def unsqueezes(a, b, *, opset=17, x_shape=("batch", "sequence"), axes_input=False):
    g = GraphBuilder(opset=opset)
    x = g.op("Neg", g.input("x", list(x_shape)))
    for i, axes in enumerate((a, b)):
        if opset >= 13:
            given = (g.op("Shape", g.input("r", [1] * len(axes))) if axes_input and i == 0
                     else g.const(np.array(axes, np.int64)))
            x = g.op("Unsqueeze", x, given, name=f"u{i}")
        else:
            x = g.op("Unsqueeze", x, name=f"u{i}", axes=list(axes))
    return g.build(x, output_names=["y"])


@pytest.mark.parametrize("a, b, kw", [
    ([1], [2], {}),                    # BERT: [B, S] -> [B, 1, 1, S]
    ([0], [0], {}),
    ([1], [1], {}),
    ([-1], [0, -1], {}),
    ([0, 2], [1, 4], {}),
    ([1], [2], {"opset": 11}),
    ([-1], [-3], {"opset": 11}),
], ids=["bert-mask", "front-front", "same-axis", "negative", "several", "attrs-opset11", "negative-attrs"])
def test_merged(tmp_path, a, b, kw):
    model = unsqueezes(a, b, **kw)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Neg": 1, "Unsqueeze": 1}
    for dims in ({"batch": 2, "sequence": 3}, {"batch": 5, "sequence": 7}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


def test_runtime_axes_are_a_near_miss(tmp_path):
    model = unsqueezes([0], [0], axes_input=True)
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), "merge-unsqueezes",
                    "u0's axes are not a constant")


def shared_unsqueeze(other_reader: str):
    """u0 = Unsqueeze(Neg(x), [1]) read by Unsqueeze(u0, [2]) -> y and by `other_reader` -> z
    (exporters unsqueeze one position range twice, for the mask and for the positions)."""
    g = GraphBuilder(opset=17)
    u0 = g.op("Unsqueeze", g.op("Neg", g.input("x", ["batch", "sequence"])), g.const(np.array([1], np.int64)),
              name="u0")
    y = g.op("Unsqueeze", u0, g.const(np.array([2], np.int64)), name="u1")
    z = (g.op("Unsqueeze", u0, g.const(np.array([0], np.int64)), name="u2") if other_reader == "Unsqueeze"
         else g.op(other_reader, u0, name="other"))
    return g.build(y, z, output_names=["y", "z"])


def test_a_first_unsqueeze_read_only_by_unsqueezes_merges_into_each(tmp_path):
    model = shared_unsqueeze("Unsqueeze")
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Neg": 1, "Unsqueeze": 2}  # each reads Neg's output; u0 is gone
    for dims in ({"batch": 2, "sequence": 3}, {"batch": 5, "sequence": 7}):
        assert_equivalent(model, result.model, dims=dims, rtol=0.0, atol=0.0)


def test_a_first_unsqueeze_read_by_another_kind_of_node_stays_a_near_miss(tmp_path):
    model = shared_unsqueeze("Relu")
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), "merge-unsqueezes",
                    "'u0_out' is also read by other")
