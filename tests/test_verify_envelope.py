"""Outputs downstream of a quantizer are judged within what onnxruntime's own optimizations move
them by on the same inputs (verify.compare_outputs, the runtime envelope): a rewrite is held to
what the runtime's optimizer does, and a wrong one is still caught."""

from __future__ import annotations


import numpy as np
import onnx
import pytest

from fuse_cli.verify import compare_outputs, compare_with_reference, outputs_after_quantizers, reference_outputs
from tests.conftest import SAMPLES, saved_by_onnxruntime
from tests.graphs import GraphBuilder
from tests.test_quantized import quantized

SETTINGS = [{"batch": 4, "sequence": 128}, {"batch": 3, "sequence": 5}]


@pytest.fixture(scope="module")
def dynamic_block(tmp_path_factory):
    """The sample transformer block quantized dynamically by onnxruntime.quantization: every
    MatMul reads a DynamicQuantizeLinear's output."""
    block = onnx.load(SAMPLES / "transformer_block_opset17.onnx")
    return quantized(block, tmp_path_factory.mktemp("dynamic"), "dynamic", pre_optimize=False)


def test_the_outputs_after_a_quantizer_are_found():
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 4])
    q, scale, zero = b.op("DynamicQuantizeLinear", x, outputs=3)
    dequantized = b.op("DequantizeLinear", q, scale, zero)
    model = b.build(b.op("Relu", dequantized), b.op("Sigmoid", x), output_names=["after", "beside"])
    assert outputs_after_quantizers(model.graph) == {"after"}


def test_a_float_model_gets_no_envelope():
    block = onnx.load(SAMPLES / "transformer_block_opset17.onnx")
    assert outputs_after_quantizers(block.graph) == set()
    assert reference_outputs(block, SETTINGS[1:]).envelope == {}


def test_onnxruntimes_own_optimized_output_is_a_match(dynamic_block, tmp_path):
    """What onnxruntime's optimizer makes of a dynamically quantized block moves its output by more
    than float32's tolerance (a fused kernel's last bit flips a quantization step): judged against
    the envelope, that is a match; judged as a float output, it is not."""
    reference = reference_outputs(dynamic_block, SETTINGS)
    envelope = reference.envelope["output"]
    assert envelope > 0
    optimized = saved_by_onnxruntime(dynamic_block, tmp_path, "all")
    result = compare_with_reference(reference, optimized)
    assert result.passed, result.outputs
    (output,) = result.outputs
    assert output.runtime_envelope == envelope and output.max_abs_diff > 0
    dims, _, expected = reference.runs[0]
    runtime = reference_outputs(optimized, [dims]).runs[0][2]
    assert not compare_outputs(expected, runtime).passed  # no envelope: the float tolerance


def test_a_wrong_weight_scale_is_outside_the_envelope(dynamic_block):
    """A quantized weight read with a scale 10% off (the bug a hand-written quantized rewrite may
    have) moves the output by far more than onnxruntime's own optimizations do."""
    wrong = onnx.ModelProto()
    wrong.CopyFrom(dynamic_block)
    (scale,) = [t for t in wrong.graph.initializer if t.name.endswith("_scale")][:1]
    values = onnx.numpy_helper.to_array(scale)
    scale.CopyFrom(onnx.numpy_helper.from_array((values * np.float32(1.1)).astype(values.dtype), scale.name))
    reference = reference_outputs(dynamic_block, SETTINGS)
    result = compare_with_reference(reference, wrong)
    assert not result.passed
    (output,) = result.outputs
    assert output.max_abs_diff > 5 * reference.envelope["output"]
