"""fuse-reshapes (Reshape chains, no-op Reshapes) and fuse-squeeze-unsqueeze (cancelling pairs)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

DIMS = ({"batch": 1}, {"batch": 3})


def chain(x_shape, *steps, opset=14, reader=False):
    """Neg(x), then each step (op, axes-or-shape, attrs), then Relu -> y. Shapes and (opset >= 13)
    axes are constant inputs; before 13 axes are attributes. Nodes are named s0, s1, ..."""
    b = GraphBuilder(opset=opset)
    t = b.op("Neg", b.input("x", list(x_shape)))
    first = None
    for i, (op, values, attrs) in enumerate(steps):
        as_input = op == "Reshape" or opset >= 13
        args = [b.const(values, dtype=np.int64)] if as_input and values is not None else []
        attrs = {**attrs, **({"axes": values} if not as_input and values is not None else {})}
        t = b.op(op, t, *args, name=f"s{i}", **attrs)
        first = first or t
    extra = [b.op("Sigmoid", first, name="reader")] if reader else []
    return b.build(b.op("Relu", t), *extra, output_names=["y", "z"][: 1 + len(extra)])


def check_fused(tmp_path, model, passes, remaining):
    result = optimize_model(model, tmp_path, passes=passes)
    assert op_counts(result.model) == remaining
    for dims in DIMS:
        assert_equivalent(model, result.model, dims=dims)
    assert not optimize_model(result.model, tmp_path, name="again", passes=passes).report.fusions
    return result.model


def check_declined(tmp_path, model, pass_name, node, reason):
    result = optimize_model(model, tmp_path, passes=(pass_name,))
    assert not result.report.fusions
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == pass_name and node in m.nodes[-1:]]
    assert reason in miss


def reshape(shape, **attrs):
    return ("Reshape", shape, attrs)


@pytest.mark.parametrize("x_shape, steps, last_shape", [
    (("batch", 3, 4), [reshape([-1, 12]), reshape([-1, 4, 3])], [-1, 4, 3]),
    ((2, 3, 4), [reshape([6, 4]), reshape([0, 2, 2])], [6, 2, 2]),
    (("batch", 3, 4), [reshape([0, 12]), reshape([0, 3, 2, 2])], [0, 3, 2, 2]),
    (("batch", 3, 4), [reshape([0, 12]), reshape([0, 2, 6]), reshape([0, 4, 3])], [0, 4, 3]),
    (("batch", 3, 4), [reshape([-1, 12]), reshape([0, 3, 4], allowzero=0), reshape([-1, 6])], [-1, 6]),
    (("batch", 6), [reshape([-1, 2, 3]), reshape([-1, 3, 2], allowzero=1)], [-1, 3, 2]),
], ids=["minus-one", "zero-copies-static-dim", "zero-copies-x-dim", "chain-of-3", "chain-through-noop",
        "allowzero"])
def test_reshape_chain_collapses(tmp_path, x_shape, steps, last_shape):
    optimized = check_fused(tmp_path, chain(x_shape, *steps), ("fuse-reshapes",), {"Neg": 1, "Reshape": 1, "Relu": 1})
    (node,) = [n for n in optimized.graph.node if n.op_type == "Reshape"]
    (shape,) = [t for t in optimized.graph.initializer if t.name == node.input[1]]
    assert list(np.frombuffer(shape.raw_data, np.int64)) == last_shape


@pytest.mark.parametrize("x_shape, shape", [
    (("batch", 3, 4), [0, 3, 4]),
    (("batch", 3, 4), [-1, 3, 4]),
    (("batch", 3, 4), [0, 0, -1]),
    ((2, 3, 4), [2, 3, 4]),
], ids=str)
def test_noop_reshape_removed(tmp_path, x_shape, shape):
    check_fused(tmp_path, chain(x_shape, reshape(shape)), ("fuse-reshapes",), {"Neg": 1, "Relu": 1})


@pytest.mark.parametrize("x_shape, shape", [
    (("batch", 3, 4), [0, 12]),
    (("batch", 3, 4), [1, 3, 4]),
    (("batch", 3, 4), [3, -1, 4]),
], ids=["reshapes", "batch-not-known-to-be-1", "moves-dims"])
def test_a_shape_changing_reshape_is_not_a_near_miss(tmp_path, x_shape, shape):
    """Most Reshapes change the shape: they are not this pattern, and no near-miss is reported."""
    model = chain(x_shape, reshape(shape))
    result = optimize_model(model, tmp_path, passes=("fuse-reshapes",))
    assert not result.report.fusions and not result.report.near_misses
    assert op_counts(result.model) == op_counts(model)


@pytest.mark.parametrize("x_shape, steps, node, reason", [
    (("batch", 3, 4), [reshape([-1, 12]), reshape([0, 3, 4])], "s1",
     "s1's shape copies dim 0 of s0's output (a 0 entry), which is not statically known"),
    (("batch", 3, 4), [reshape([-1, 6]), reshape([0, 3, 4])], "s1",
     "s1's shape copies dim 0 of s0's output (a 0 entry), which is not statically known"),
], ids=["zero-copies-unknown-dim", "zero-copies-2-batch"])
def test_reshape_kept(tmp_path, x_shape, steps, node, reason):
    check_declined(tmp_path, chain(x_shape, *steps), "fuse-reshapes", node, reason)


def test_chain_that_undoes_itself_is_removed(tmp_path):
    model = chain(("batch", 6), reshape([-1, 2, 3]), reshape([0, 6]), reshape([-1, 6]))
    check_fused(tmp_path, model, ("fuse-reshapes",), {"Neg": 1, "Relu": 1})


def test_reshape_first_read_elsewhere_is_kept(tmp_path):
    model = chain(("batch", 3, 4), reshape([-1, 12]), reshape([-1, 4, 3]), reader=True)
    check_declined(tmp_path, model, "fuse-reshapes", "s1", "s0's output 's0_out' is also read by reader")


def test_noop_reshape_at_graph_output_keeps_the_name(tmp_path):
    b = GraphBuilder()
    model = b.build(b.op("Reshape", b.op("Neg", b.input("x", ["batch", 3])), b.const([0, 3], dtype=np.int64)),
                    output_names=["y"])
    optimized = check_fused(tmp_path, model, ("fuse-reshapes",), {"Neg": 1})
    assert [o.name for o in optimized.graph.output] == ["y"]


def transpose(perm):
    return ("Transpose", None, {"perm": perm})


@pytest.mark.parametrize("x_shape, perm, shape", [
    (("batch", 1, 1, 8), [0, 3, 1, 2], [-1, 8]),      # ConvNeXt's head: [B, 1, 1, C] -> [B, C, 1, 1], flattened
    ((2, 1, 3, 1), [1, 0, 3, 2], [3, 2]),              # unit axes moved on both sides of the others
    (("batch", 4), [0, 1], [-1, 2, 2]),                # the identity
])
def test_a_transpose_that_moves_only_unit_axes_goes_before_a_reshape(tmp_path, x_shape, perm, shape):
    model = chain(x_shape, transpose(perm), reshape(shape))
    check_fused(tmp_path, model, ("fuse-reshapes",), {"Neg": 1, "Reshape": 1, "Relu": 1})


@pytest.mark.parametrize("x_shape, perm", [
    (("batch", 3, 4), [0, 2, 1]),     # a real permutation
    (("batch", "n", 1), [1, 0, 2]),   # a symbolic dim may be anything: not 1
])
def test_a_transpose_that_moves_elements_is_not_this_pattern(tmp_path, x_shape, perm):
    model = chain(x_shape, transpose(perm), reshape([-1]))
    result = optimize_model(model, tmp_path, passes=("fuse-reshapes",))
    assert not result.report.fusions and not result.report.near_misses
    assert signature(result.model) == signature(model)


def test_a_unit_transpose_is_kept_where_the_reshape_copies_its_dims_or_it_is_read_elsewhere(tmp_path):
    check_declined(tmp_path, chain((2, 1, 3), transpose([1, 0, 2]), reshape([0, -1])), "fuse-reshapes", "s1",
                   "copies a dim of s0's output")
    check_declined(tmp_path, chain(("batch", 1, 8), transpose([0, 2, 1]), reshape([-1, 8]), reader=True),
                   "fuse-reshapes", "s1", "s0's output 's0_out' is also read by reader")


@pytest.mark.parametrize("opset", [11, 13], ids=["axes-attribute", "axes-input"])
@pytest.mark.parametrize("x_shape, steps", [
    (("batch", 3), [("Unsqueeze", [1], {}), ("Squeeze", [1], {})]),
    (("batch", 3), [("Unsqueeze", [-1], {}), ("Squeeze", [2], {})]),
    (("batch", 3), [("Unsqueeze", [0, 3], {}), ("Squeeze", [3, 0], {})]),
    (("batch", 1, 3), [("Squeeze", [1], {}), ("Unsqueeze", [1], {})]),
    (("batch", 1, 3), [("Squeeze", [-2], {}), ("Unsqueeze", [1], {})]),
    ((2, 1, 3), [("Squeeze", None, {}), ("Unsqueeze", [-2], {})]),
], ids=["unsqueeze-squeeze", "negative-axis", "two-axes", "squeeze-unsqueeze", "squeeze-negative",
        "squeeze-all-static"])
def test_squeeze_pairs_cancel(tmp_path, x_shape, steps, opset):
    check_fused(tmp_path, chain(x_shape, *steps, opset=opset), ("fuse-squeeze-unsqueeze",), {"Neg": 1, "Relu": 1})


def _axes_input():
    b = GraphBuilder(opset=13)
    u = b.op("Unsqueeze", b.input("x", ["batch", 3]), b.input("axes", [1], dtype=7), name="s0")
    return b.build(b.op("Squeeze", u, b.const([1], dtype=np.int64), name="s1"), output_names=["y"])


@pytest.mark.parametrize("build, reason", [
    (lambda: chain(("batch", 3, 1), ("Unsqueeze", [1], {}), ("Squeeze", [3], {})),
     "s0 and s1 act on different axes ([1] vs [3])"),
    (lambda: chain(("batch", 1, 3), ("Squeeze", None, {}), ("Unsqueeze", [1], {})),
     "s0 squeezes every size-1 dim, and its input's dims are not all static"),
    (lambda: chain((2, 1, 3), ("Unsqueeze", [0], {}), ("Squeeze", None, {})),
     "s0 and s1 act on different axes ([0] vs [0, 2])"),
    (_axes_input, "s0's axes 'axes' are not a constant"),
], ids=["different-axes", "squeeze-all-symbolic", "squeeze-all-takes-more", "axes-input"])
def test_squeeze_pairs_kept(tmp_path, build, reason):
    check_declined(tmp_path, build(), "fuse-squeeze-unsqueeze", "s1", reason)


@pytest.mark.parametrize("op", ["Unsqueeze", "Squeeze"])
def test_two_of_the_same_op_are_not_a_pair(tmp_path, op):
    """Unsqueeze + Unsqueeze is not this pattern: no near-miss at all."""
    shape, axes = (("batch", 3), [1]) if op == "Unsqueeze" else ((2, 1, 1, 3), [1])
    model = chain(shape, (op, axes, {}), (op, axes, {}))
    result = optimize_model(model, tmp_path, passes=("fuse-squeeze-unsqueeze",))
    assert not result.report.fusions and not result.report.near_misses
