"""Verification's tolerances follow the dtype an output is computed in, and its relative
difference leaves out elements whose reference is near 0."""

import numpy as np
import onnx
from onnx import TensorProto

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.verify import DEFAULT_TOLERANCES, compare_outputs, computed_dtypes, verify_models
from tests.graphs import GraphBuilder, op_counts


def keep_io_types_conv_bn() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu in fp16 between float32 input and output, as
    onnxconverter_common's convert_float_to_float16(keep_io_types=True) writes it."""
    b = GraphBuilder(seed=3)
    x = b.op("Cast", b.input("x", ["batch", 3, 8, 8]), to=TensorProto.FLOAT16, name="graph_input_cast0")
    half = np.float16
    c = b.op("Conv", x, b.const(b.rand(8, 3, 3, 3, dtype=half)), pads=[1, 1, 1, 1], name="conv")
    y = b.op("BatchNormalization", c, b.const(b.rand(8, low=0.5, high=1.5, dtype=half)),
             b.const(b.rand(8, dtype=half)), b.const(b.rand(8, dtype=half)),
             b.const(b.rand(8, low=0.5, high=1.5, dtype=half)), epsilon=1e-5, name="bn")
    out = b.op("Cast", b.op("Relu", y), to=TensorProto.FLOAT, name="graph_output_cast0")
    return b.build(out, output_names=["y"])


def test_an_output_cast_from_fp16_is_computed_in_fp16():
    model = keep_io_types_conv_bn()
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert computed_dtypes(model.graph) == {"y": np.dtype(np.float16)}


def test_a_conv_bn_fold_in_an_fp16_model_with_float32_io_is_judged_by_fp16_tolerances(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(keep_io_types_conv_bn(), path)
    out = tmp_path / "o.onnx"
    report = api.optimize(path, FuseConfig(passes=("conv-bn",)), out).report
    assert report.exit_code == 0 and not report.rolled_back and report.verification.passed
    assert op_counts(onnx.load(out))["BatchNormalization"] == 0
    (compared,) = report.verification.outputs
    assert compared.rtol == DEFAULT_TOLERANCES[np.dtype(np.float16)][0]  # its atol scales with the magnitude
    fp32_rtol, fp32_atol = DEFAULT_TOLERANCES[np.dtype(np.float32)]
    strict = verify_models(str(path), str(out), rtol=fp32_rtol, atol=fp32_atol)
    assert not strict.passed, "the fold's fp16 rounding is beyond float32's tolerance: the test must bite"


def test_a_wrong_rewrite_of_the_fp16_model_still_fails():
    model = keep_io_types_conv_bn()
    wrong = keep_io_types_conv_bn()
    bn = next(n for n in wrong.graph.node if n.op_type == "BatchNormalization")
    bn.attribute[0].f = 0.5  # epsilon
    assert next(a.name for a in bn.attribute) == "epsilon"
    assert verify_models(model, wrong).status == "mismatch"


def test_relative_difference_leaves_out_references_near_zero():
    want = {"y": np.array([0.0, 0.0, 0.5, 1.0], np.float32)}
    got = {"y": np.array([1e-30, 2e-6, 0.5, 1.00001], np.float32)}
    (o,) = compare_outputs(want, got).outputs
    assert o.passed
    assert o.max_abs_diff > 1e-5 * 0.99
    assert abs(o.max_rel_diff - 1e-5) < 1e-6, o.max_rel_diff


def test_float16_outputs_allow_a_few_ulps_of_their_magnitude_near_zero():
    """A correct float16 fusion deep in a network moves elements near 0 by a few ulps of the
    output's magnitude (2.5 in a 12-layer BERT); a wrong one by far more."""
    rng = np.random.default_rng(0)
    want = rng.normal(0, 2.5, 1000).astype(np.float16)
    want[0] = 0.25
    ulp = float(np.spacing(np.float16(5.0)))  # at the output's magnitude
    near = want.copy()
    near[0] += np.float16(2.5 * ulp)
    far = want.copy()
    far[0] += np.float16(20 * ulp)
    assert compare_outputs({"y": want}, {"y": near}).passed
    assert not compare_outputs({"y": want}, {"y": far}).passed
