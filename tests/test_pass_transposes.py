"""fuse-transposes: Transpose pairs compose into one Transpose or cancel."""

from __future__ import annotations

import pytest

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASSES = ("fuse-transposes",)
NCHW_TO_NHWC, NHWC_TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def transposes(*perms, x_shape=("batch", 3, 4, 5), reader=False):
    """Neg(x) then one Transpose per perm (None: attribute left out), then Relu -> y."""
    b = GraphBuilder()
    t = b.op("Neg", b.input("x", list(x_shape)))
    outs = []
    for i, perm in enumerate(perms):
        t = b.op("Transpose", t, name=f"t{i}", **({} if perm is None else {"perm": perm}))
        outs.append(t)
    extra = [b.op("Sigmoid", outs[0], name="reader")] if reader else []
    return b.build(b.op("Relu", t), *extra, output_names=["y", "z"][: 1 + len(extra)])


def perm_of(model):
    (node,) = [n for n in model.graph.node if n.op_type == "Transpose"]
    return list(next(a.ints for a in node.attribute if a.name == "perm"))


@pytest.mark.parametrize("perms, expected", [
    ((NCHW_TO_NHWC, NHWC_TO_NCHW), None),
    ((NHWC_TO_NCHW, NCHW_TO_NHWC), None),
    ((None, None), None),
    (([3, 2, 1, 0], None), None),
    ((NCHW_TO_NHWC, [0, 2, 1, 3]), [0, 3, 2, 1]),
    ((None, [1, 0, 2, 3]), [2, 3, 1, 0]),
    (([1, 0, 2, 3], None), [3, 2, 0, 1]),
    ((NCHW_TO_NHWC, [0, 2, 1, 3], [0, 1, 3, 2]), [0, 3, 1, 2]),
    ((NCHW_TO_NHWC, NHWC_TO_NCHW, [0, 1, 3, 2]), [0, 1, 3, 2]),
], ids=["nhwc-roundtrip", "nchw-roundtrip", "both-reverse", "perm-then-reverse", "compose", "reverse-then-perm",
        "perm-then-reverse-compose", "chain-of-3", "cancel-then-keep"])
def test_fused(tmp_path, perms, expected):
    model = transposes(*perms, x_shape=(2, 3, 4, 5) if None in perms else ("batch", 3, 4, 5))
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == ({"Neg": 1, "Relu": 1} | ({"Transpose": 1} if expected else {}))
    if expected:
        assert perm_of(result.model) == expected
    for dims in ({"batch": 1}, {"batch": 3}):
        assert_equivalent(model, result.model, dims=dims)
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


def test_cancelling_pair_at_graph_output_keeps_the_name(tmp_path):
    b = GraphBuilder()
    t = b.op("Transpose", b.op("Transpose", b.op("Neg", b.input("x", [2, 3])), perm=[1, 0]), perm=[1, 0])
    model = b.build(t, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Neg": 1}
    assert [o.name for o in result.model.graph.output] == ["y"]
    assert_equivalent(model, result.model)


def _input_to_output():
    b = GraphBuilder()
    t = b.op("Transpose", b.op("Transpose", b.input("x", [2, 3]), perm=[1, 0], name="t0"), perm=[1, 0], name="t1")
    return b.build(t, output_names=["y"])


@pytest.mark.parametrize("build, reason", [
    (lambda: transposes(NCHW_TO_NHWC, NHWC_TO_NCHW, reader=True), "t0's output 't0_out' is also read by reader"),
    (lambda: transposes(NCHW_TO_NHWC, [0, 2, 1, 3], reader=True), "t0's output 't0_out' is also read by reader"),
    (_input_to_output, "'y' is a graph output fed directly by 'x', which is a graph input"),
], ids=["first-read-elsewhere", "compose-first-read-elsewhere", "cancel-input-to-output"])
def test_kept(tmp_path, build, reason):
    model = build()
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert not result.report.fusions
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "fuse-transposes"]
    assert reason in miss
