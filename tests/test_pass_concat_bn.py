"""concat-conv-bn: BatchNormalization after a channel Concat of Convs folds into each Conv."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

BRANCHES = {  # op, weight shape, attributes, output channels; every branch maps [b,4,8,8] to [b,C,8,8]
    "conv3x3": ("Conv", (3, 4, 3, 3), {"pads": [1, 1, 1, 1]}, 3),
    "conv1x1-nobias": ("Conv", (5, 4, 1, 1), {}, 5),
    "grouped": ("Conv", (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}, 6),
    "transpose": ("ConvTranspose", (4, 2, 3, 3), {"pads": [1, 1, 1, 1]}, 2),
    "transpose-grouped": ("ConvTranspose", (4, 2, 1, 1), {"group": 2}, 4),
}


def concat_bn(branches, *, axis: int = 1, opset: int = 17, bn_attrs=None, dtype=np.float32,
              extra=None) -> onnx.ModelProto:
    """x -> one Conv per branch -> Concat(axis) [+ `extra`'s (tensor, channels)] -> BatchNormalization."""
    b = GraphBuilder(opset=opset)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = b.input("x", ["batch", 4, 8, 8], elem)
    outs = []
    for i, kind in enumerate(branches):
        op, w_shape, attrs, channels = BRANCHES[kind]
        inputs = [x, b.const(b.rand(*w_shape, dtype=dtype), name=f"w{i}")]
        if "nobias" not in kind:
            inputs.append(b.const(b.rand(channels, dtype=dtype), name=f"b{i}"))
        outs.append(b.op(op, *inputs, name=f"conv{i}", **attrs))
    total = sum(BRANCHES[k][3] for k in branches)
    if extra:
        tensor, channels = extra(b, x)
        outs.append(tensor)
        total += channels
    c = b.op("Concat", *outs, name="concat", axis=axis)
    n = total if axis % 4 == 1 else 4
    params = [b.rand(n, low=0.5, high=1.5), b.rand(n), b.rand(n), b.rand(n, low=0.5, high=2.0)]
    names = ("gamma", "beta", "mean", "var")
    y = b.op("BatchNormalization", c, *(b.const(p.astype(dtype), name=k) for p, k in zip(params, names)),
             name="bn", epsilon=1e-3, **(bn_attrs or {}))
    return b.build(y, output_names=["y"])


POSITIVE = {
    "two-convs": ["conv3x3", "conv1x1-nobias"],
    "three-mixed": ["grouped", "conv3x3", "transpose"],
    "transposes": ["transpose-grouped", "transpose"],
    "single": ["conv3x3"],
}


@pytest.mark.parametrize("axis", [1, -3])
@pytest.mark.parametrize("case", POSITIVE)
def test_folds_into_each_conv(tmp_path, case, axis):
    model = concat_bn(POSITIVE[case], axis=axis)
    result = optimize_model(model, tmp_path, passes=("concat-conv-bn",))
    counts = op_counts(result.model)
    assert counts.pop("Concat") == 1 and "BatchNormalization" not in counts
    assert sum(counts.values()) == len(POSITIVE[case])
    assert all(len(n.input) == 3 for n in result.model.graph.node if n.op_type != "Concat")
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("concat-conv-bn",)).report.fusions


def test_fp16_folds_in_float64(tmp_path):
    model = concat_bn(["conv3x3", "conv1x1-nobias"], dtype=np.float16)
    result = optimize_model(model, tmp_path, passes=("concat-conv-bn",))
    assert op_counts(result.model) == {"Conv": 2, "Concat": 1}
    p = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    s = p["gamma"] / np.sqrt(p["var"] + float(np.float32(1e-3)))
    folded = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    second = next(n for n in result.model.graph.node if n.name == "conv1")
    np.testing.assert_array_equal(folded[second.input[1]], (p["w1"] * s[3:].reshape(5, 1, 1, 1)).astype(np.float16))
    assert_equivalent(model, result.model, dims={"batch": 2}, rtol=1e-2, atol=1e-2)


def _relu_branch(b, x):
    return b.op("Relu", b.op("Conv", x, b.const(b.rand(2, 4, 1, 1)), name="convr"), name="relu"), 2


NEAR_MISSES = {  # branches, build overrides, reason
    "same-conv-twice": (["conv1x1-nobias", "conv3x3"], {"extra": lambda b, x: ("conv0_out", 5)},
                        "concat reads 'conv0_out' more than once"),
    "spatial-axis": (["conv3x3", "conv1x1-nobias"], {"axis": 2}, "concatenates on axis 2, not the channel axis 1"),
    "training-mode": (["conv3x3", "conv3x3"], {"bn_attrs": {"training_mode": 1}}, "training mode"),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss(tmp_path, case):
    branches, kw, reason = NEAR_MISSES[case]
    model = concat_bn(branches, **kw)
    result = optimize_model(model, tmp_path, passes=("concat-conv-bn",))
    assert not result.report.fusions
    assert op_counts(result.model) == op_counts(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "concat-conv-bn"]
    assert reason in miss


NOT_THE_PATTERN = {  # a Concat input no Conv computes (DenseNet's pooled features): silent
    "relu-input": (["conv3x3", "conv1x1-nobias"], {"extra": _relu_branch}),
    "graph-input": (["conv3x3"], {"extra": lambda b, x: (b.input("z", ["batch", 2, 8, 8]), 2)}),
}


@pytest.mark.parametrize("case", NOT_THE_PATTERN)
def test_not_the_pattern_is_silent(tmp_path, case):
    branches, kw = NOT_THE_PATTERN[case]
    model = concat_bn(branches, **kw)
    result = optimize_model(model, tmp_path, passes=("concat-conv-bn",))
    assert not result.report.fusions and not result.report.near_misses
    assert op_counts(result.model) == op_counts(model)


def test_conv_output_read_elsewhere_is_a_near_miss(tmp_path):
    model = concat_bn(["conv3x3", "conv1x1-nobias"])
    model.graph.node.append(onnx.helper.make_node("Relu", ["conv0_out"], ["z"], name="reader"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    result = optimize_model(model, tmp_path, passes=("concat-conv-bn",))
    assert not result.report.fusions
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "concat-conv-bn"]
    assert "'conv0_out' is also read by reader" in miss
