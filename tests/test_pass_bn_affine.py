"""bn-affine: BatchNormalization -> Mul + Add, declined by default because BN measured faster."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.passes.bn_affine import BatchNormToAffine
from fuse_cli.pipeline.engine import run_pipeline
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import IR_VERSION, GraphBuilder, op_counts


class AlwaysAffine(BatchNormToAffine):
    """The pass with the measured preference switched off: only the exactness conditions remain."""

    def check(self, m, g):
        return self.exact_reason(m, g)


def bn_model(shape, *, opset: int = 17, dtype=np.float32, bn_attrs=None) -> onnx.ModelProto:
    b = GraphBuilder(opset=opset)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    c = shape[1]
    params = [b.rand(c, low=0.5, high=1.5), b.rand(c), b.rand(c), b.rand(c, low=0.5, high=2.0)]
    y = b.op("BatchNormalization", b.input("x", shape, elem), *(b.const(p.astype(dtype)) for p in params),
             name="bn", epsilon=1e-3, **(bn_attrs or {}))
    return b.build(y, output_names=["y"])


def run_forced(model: onnx.ModelProto):
    graph = gs.import_onnx(model)
    fusions, misses = run_pipeline(GraphEditor(graph, opset=model.opset_import[0].version, shapes={}, dtypes={}),
                                   [AlwaysAffine()], lambda name: None)
    graph.cleanup()
    out = gs.export_onnx(graph)
    out.ir_version = IR_VERSION
    return out, fusions, misses


def test_default_declines_with_the_measured_reason(tmp_path):
    model = bn_model(["batch", 8, 5, 5])
    result = optimize_model(model, tmp_path)
    assert op_counts(result.model) == {"BatchNormalization": 1}
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == "bn-affine"]
    assert "BatchNormalization runs faster than Mul+Add in onnxruntime (measured" in miss


SHAPES = {"nchw": ["batch", 8, 5, 5], "nc": ["batch", 8], "ncl": ["batch", 8, 7], "ncdhw": ["batch", 8, 3, 3, 3]}


@pytest.mark.parametrize("shape", SHAPES)
def test_rewrite_is_exact_when_forced(shape):
    model = bn_model(SHAPES[shape])
    out, fusions, _ = run_forced(model)
    assert len(fusions) == 1 and op_counts(out) == {"Mul": 1, "Add": 1}
    for batch in (1, 3):
        assert_equivalent(model, out, dims={"batch": batch})
    assert not run_forced(out)[1]


def test_rewrite_fp16_when_forced():
    model = bn_model(["batch", 8, 5, 5], dtype=np.float16)
    out, fusions, _ = run_forced(model)
    assert len(fusions) == 1
    assert all(t.data_type == TensorProto.FLOAT16 for t in out.graph.initializer)
    # fp16: the affine form rounds after the Mul as well as after the Add
    assert_equivalent(model, out, dims={"batch": 2}, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("case", ["training-mode", "unknown-rank"])
def test_exactness_near_misses(case):
    model = bn_model(["batch", 8, 5, 5], bn_attrs={"training_mode": 1} if case == "training-mode" else None)
    if case == "unknown-rank":
        model.graph.input[0].type.tensor_type.ClearField("shape")
    out, fusions, misses = run_forced(model)
    assert not fusions and op_counts(out) == {"BatchNormalization": 1}
    assert ("training mode" if case == "training-mode" else "rank of bn's input is unknown") in misses[0].reason
