"""pad-conv: a zero constant Pad of the spatial axes folds into the Conv's pads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts


def pad_conv(pads: list[int], *, opset: int = 17, rank: int = 4, conv_attrs=None, value=None, axes=None,
             mode: str | None = None, bias: bool = True) -> onnx.ModelProto:
    """x -> Pad(pads) -> Conv; pads as an attribute before opset 11, as inputs from 11."""
    b = GraphBuilder(opset=opset)
    x = b.input("x", ["batch", 4] + [9] * (rank - 2))
    mode_attr = {"mode": mode} if mode else {}
    if opset < 11:
        value_attr = {"value": value} if value is not None else {}
        p = b.op("Pad", x, name="pad", pads=pads, **mode_attr, **value_attr)
    else:
        extra = [b.const(pads, dtype=np.int64)]
        if value is not None or axes is not None:
            extra.append(b.const(value, dtype=np.float32) if value is not None else "")
        if axes is not None:
            extra.append(b.const(axes, dtype=np.int64))
        p = b.op("Pad", x, *extra, name="pad", **mode_attr)
    w = b.const(b.rand(6, 4, *[3] * (rank - 2)))
    y = b.op("Conv", p, w, *([b.const(b.rand(6))] if bias else []), name="conv", **(conv_attrs or {}))
    return b.build(y, output_names=["y"])


POSITIVE = {  # opset, rank, Pad pads, Conv attributes, expected Conv pads
    "opset10-attr": (10, 4, [0, 0, 1, 2, 0, 0, 1, 2], {}, [1, 2, 1, 2]),
    "opset13-input": (13, 4, [0, 0, 1, 0, 0, 0, 2, 1], {"pads": [1, 1, 1, 1]}, [2, 1, 3, 2]),
    "asymmetric-strided": (17, 4, [0, 0, 0, 3, 0, 0, 2, 0], {"strides": [2, 2], "dilations": [2, 1]}, [0, 3, 2, 0]),
    "1d": (17, 3, [0, 0, 2, 0, 0, 1], {"pads": [1, 1]}, [3, 2]),
    "3d": (17, 5, [0, 0, 1, 0, 1, 0, 0, 1, 1, 0], {}, [1, 0, 1, 1, 1, 0]),
    "auto-pad-valid": (17, 4, [0, 0, 1, 1, 0, 0, 1, 1], {"auto_pad": "VALID"}, [1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", POSITIVE)
def test_folds(tmp_path, case):
    opset, rank, pads, attrs, expected = POSITIVE[case]
    model = pad_conv(pads, opset=opset, rank=rank, conv_attrs=attrs)
    result = optimize_model(model, tmp_path, passes=("pad-conv",))
    assert op_counts(result.model) == {"Conv": 1}
    conv = result.model.graph.node[0]
    attributes = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attributes["pads"] == expected and "auto_pad" not in attributes
    for batch in (1, 3):
        assert_equivalent(model, result.model, dims={"batch": batch})
    assert not optimize_model(result.model, tmp_path, name="again", passes=("pad-conv",)).report.fusions


@pytest.mark.parametrize("form", ["zero-value", "axes-opset18", "negative-axes-opset18", "no-bias"])
def test_optional_inputs(tmp_path, form):
    kw = {"zero-value": {"value": 0.0}, "axes-opset18": {"opset": 18, "axes": [2, 3]},
          "negative-axes-opset18": {"opset": 18, "axes": [-1], "value": 0.0}, "no-bias": {"bias": False}}[form]
    axes = kw.get("axes")
    pads = [0, 0, 1, 2, 0, 0, 0, 1] if axes is None else [1, 2] if len(axes) == 1 else [1, 2, 0, 1]
    model = pad_conv(pads, **kw)
    result = optimize_model(model, tmp_path, passes=("pad-conv",))
    assert op_counts(result.model) == {"Conv": 1}
    assert_equivalent(model, result.model, dims={"batch": 2})


NEAR_MISSES = {
    "reflect": ({"mode": "reflect"}, [0, 0, 1, 1, 0, 0, 1, 1], "pads in 'reflect' mode"),
    "edge-opset10": ({"mode": "edge", "opset": 10}, [0, 0, 1, 1, 0, 0, 1, 1], "pads in 'edge' mode"),
    "non-zero-value": ({"value": 0.5}, [0, 0, 1, 1, 0, 0, 1, 1], "pads with the value 0.5"),
    "non-zero-value-opset10": ({"value": -1.0, "opset": 10}, [0, 0, 1, 1, 0, 0, 1, 1], "pads with the value -1.0"),
    "channel-axis": ({}, [0, 1, 1, 1, 0, 0, 1, 1], "pads the batch or channel axis"),
    "channel-axis-via-axes": ({"opset": 18, "axes": [1, 3]}, [1, 1, 0, 1], "pads the batch or channel axis"),
    "negative-pads": ({}, [0, 0, -1, 1, 0, 0, 1, 1], "has negative pads"),
    "auto-pad-same": ({"conv_attrs": {"auto_pad": "SAME_UPPER"}}, [0, 0, 1, 1, 0, 0, 1, 1], "auto_pad=SAME_UPPER"),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss(tmp_path, case):
    kw, pads, reason = NEAR_MISSES[case]
    model = pad_conv(pads, **kw)
    result = optimize_model(model, tmp_path, passes=("pad-conv",))
    assert not result.report.fusions
    assert [n.op_type for n in result.model.graph.node] == ["Pad", "Conv"]
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "pad-conv"]
    assert reason in miss


def test_pads_computed_at_run_time_is_a_near_miss(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [1, 4, 9, 9])
    pads = b.op("Concat", b.input("p", [4], onnx.TensorProto.INT64), b.const([1, 1, 1, 1], dtype=np.int64), axis=0)
    y = b.op("Conv", b.op("Pad", x, pads, name="pad"), b.const(b.rand(6, 4, 3, 3)), name="conv")
    result = optimize_model(b.build(y, output_names=["y"]), tmp_path, passes=("pad-conv",))
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "pad-conv"]
    assert "pad's pads" in miss and "computed at run time by Concat" in miss
