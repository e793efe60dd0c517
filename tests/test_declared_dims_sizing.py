"""A dim name only intermediates or outputs declare (paddle2onnx writes `Reshape_470_o0__d2` on
value_info) is no size for the user to choose: the memory estimate takes it from where inference
sized a tensor declared with it, instead of taking it as 1 and pinning every such tensor at 1
(PP-OCRv6's recognizer: 56.1 MB estimated, 98.8 MB allocated; now 98.7)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from fuse_cli.analysis.measure import measure_peak
from tests.conftest import optimize_model
from tests.graphs import GraphBuilder

DIMS = {"batch": 8, "width": 1024}


def folded_twice(declare_plain: bool = True) -> onnx.ModelProto:
    """x [batch, width, 16] reshaped to [batch, width / 4, 64] twice: once to a shape computed at
    run time (Shape, Slice, Div: inference cannot read its size) that a MatMul widens to
    [batch, width / 4, 1024], once to [0, -1, 64] (inference sizes it). The exporter declared all
    three (or, not `declare_plain`, the first two) with one name for width / 4, which no input carries."""
    b = GraphBuilder(opset=17, seed=2)
    x = b.input("x", ["batch", "width", 16])
    shape = b.op("Shape", x)
    batch = b.op("Slice", shape, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)))
    width = b.op("Slice", shape, b.const(np.array([1], np.int64)), b.const(np.array([2], np.int64)))
    quarter = b.op("Div", width, b.const(np.array([4], np.int64)))
    folded = b.op("Reshape", x, b.op("Concat", batch, quarter, b.const(np.array([64], np.int64)), axis=0))
    plain = b.op("Reshape", x, b.const(np.array([0, -1, 64], np.int64)))
    wide = b.op("MatMul", folded, b.const(b.rand(64, 1024)))
    axis = b.const(np.array([2], np.int64))
    y = b.op("Add", b.op("ReduceSum", b.op("Relu", wide), axis), b.op("ReduceSum", plain, axis))
    model = b.build(y, output_names=["y"])
    for name, columns in ((folded, 64), (plain, 64), (wide, 1024))[:: 1 if declare_plain else 2]:
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, ["batch", "Reshape_o0__d1", columns]))
    return model


def test_a_declared_only_name_is_sized_where_inference_sized_it(tmp_path):
    model = folded_twice()
    report = optimize_model(model, tmp_path, passes=(), dims=DIMS).report
    assert "Reshape_o0__d1" not in report.unbound_dims  # not taken as 1
    wide_bytes = 8 * 256 * 1024 * 4
    assert report.memory.before.peak_bytes > wide_bytes  # the [8, 256, 1024] product (8 MiB) is counted
    measured = measure_peak(model, dims=DIMS, repeats=1)
    if measured.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {measured.allocated_reason}")
    assert abs(report.memory.before.peak_bytes / measured.allocated_bytes - 1) < 0.02, (report.memory.before, measured)


def test_a_name_sized_nowhere_is_still_taken_as_one(tmp_path):
    """Declared only where inference cannot size it, nothing tells the name's size: taken as 1, and
    the report says so."""
    report = optimize_model(folded_twice(declare_plain=False), tmp_path, passes=(), dims=DIMS).report
    assert "Reshape_o0__d1" in report.unbound_dims


def test_an_outputs_declared_guess_does_not_hide_its_size(tmp_path):
    """ddddocr's CRNN declares its output [1, seqlen] where it computes [T, 1, classes]: a name no
    input carries on a declaration of the wrong rank. Its size comes from the inputs."""
    b = GraphBuilder(opset=17, seed=3)
    x = b.input("x", ["batch", "width", 16])
    steps = b.op("Transpose", b.op("Reshape", x, b.const(np.array([0, 0, 4, 4], np.int64))), perm=[0, 2, 1, 3])
    shape = b.op("Shape", steps)
    first, second = (b.op("Unsqueeze", b.op("Gather", shape, b.const(np.array(i, np.int64)), axis=0),
                          b.const(np.array([0], np.int64))) for i in (0, 1))
    rows = b.op("Gemm", b.op("Reshape", steps, b.const(np.array([-1, 16], np.int64))), b.const(b.rand(4096, 16)),
                transB=1)
    y = b.op("Reshape", rows, b.op("Concat", first, second, b.const(np.array([-1], np.int64)), axis=0))
    model = b.build(y, output_names=["y"])
    model.graph.output[0].type.tensor_type.shape.Clear()
    for dim in (1, "seqlen"):
        model.graph.output[0].type.tensor_type.shape.dim.add().CopyFrom(onnx.TensorShapeProto.Dimension(
            **({"dim_value": dim} if isinstance(dim, int) else {"dim_param": dim})))
    report = optimize_model(model, tmp_path, passes=(), dims={"batch": 16, "width": 32}).report
    assert not report.memory.before.unknown_tensors
    assert report.memory.before.peak_bytes >= 2 * 16 * 32 * 4096 * 4  # rows and the output, 8 MiB each
    measured = measure_peak(model, dims={"batch": 16, "width": 32}, repeats=1)
    if measured.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {measured.allocated_reason}")
    assert abs(report.memory.before.peak_bytes / measured.allocated_bytes - 1) < 0.02, (report.memory.before, measured)
