"""Outputs downstream of a quantizer are judged within what onnxruntime's own optimizations move
them by on the same inputs (verify.compare_outputs, the runtime envelope): a rewrite is held to
what the runtime's optimizer does, and a wrong one is still caught."""

from __future__ import annotations


import numpy as np
import onnx
import pytest

from fuse_cli.verify import (FLIP_FRACTION, compare_outputs, compare_with_reference, make_session,
                             outputs_after_quantizers, reference_outputs, run)
from tests.conftest import SAMPLES, optimize_model, saved_by_onnxruntime
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
    assert not result.passed and result.outputs, result.reason
    (output,) = result.outputs
    assert output.max_abs_diff > 5 * reference.envelope["output"]


FLIP_SETTING = {"batch": 8, "sequence": 64}


def test_a_rounding_flip_passes_on_a_second_look(dynamic_block, tmp_path):
    """fuse's MultiHeadAttention differs from the decomposed attention in float's last bits; before
    a DynamicQuantizeLinear that flips one rounding, and one row of the output moves by a step
    (beyond the envelope, which onnxruntime's optimizer happened not to flip). On fresh inputs the
    flip lands elsewhere or nowhere: a match, and the verdict says so."""
    from fuse_cli.report.render import verdict_line

    fused = optimize_model(dynamic_block, tmp_path, target="ort-cpu", allow_peak_growth=False).model
    reference = reference_outputs(dynamic_block, [FLIP_SETTING])
    (_, feeds, expected), = reference.runs
    first_look = compare_outputs(expected, run(make_session(fused), feeds), envelope=reference.envelope)
    (raw,) = first_look.outputs
    assert not raw.passed and 0 < raw.beyond <= FLIP_FRACTION * np.prod(raw.shape)  # the flip, seen plainly
    result = compare_with_reference(reference, fused)
    assert result.passed, result.outputs
    (output,) = result.outputs
    assert output.flipped_at == "batch=8, sequence=64" and output.beyond == raw.beyond
    # both settings together: the flip is the record kept, with its own count
    both = compare_with_reference(reference_outputs(dynamic_block, [SETTINGS[1], FLIP_SETTING]), fused)
    (kept,) = both.outputs
    assert both.passed and kept.flipped_at == "batch=8, sequence=64" and kept.beyond == raw.beyond
    assert "a rounding flip after a quantizer" in verdict_line(result)


def _with_output_rewritten(model: onnx.ModelProto, nodes, constants) -> onnx.ModelProto:
    """`model` with its output "output" renamed "inner" and `nodes` (reading "inner", writing
    "output") after it: a candidate wrong in a way the tests choose."""
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    for node in wrong.graph.node:
        node.output[:] = ["inner" if o == "output" else o for o in node.output]
    wrong.graph.initializer.extend(onnx.numpy_helper.from_array(value, name) for name, value in constants.items())
    wrong.graph.node.extend(nodes)
    return wrong


def test_a_rewrite_wrong_at_the_same_positions_is_still_a_mismatch(dynamic_block):
    """A candidate off by 0.05 on each sequence's first token (1 of 128 rows: within FLIP_FRACTION,
    and within FLIP_STEPS of the range) is off there on fresh inputs too: the second look runs,
    and does not pass it."""
    helper = onnx.helper
    index = {name: np.array([value], np.int64) for name, value in (("zero", 0), ("one", 1), ("end", 2**62))}
    wrong = _with_output_rewritten(dynamic_block, [
        helper.make_node("Slice", ["inner", "zero", "one", "one"], ["first"]),
        helper.make_node("Slice", ["inner", "one", "end", "one"], ["rest"]),
        helper.make_node("Add", ["first", "shift"], ["first_shifted"]),
        helper.make_node("Concat", ["first_shifted", "rest"], ["output"], axis=1)],
        {**index, "shift": np.float32(0.05)})
    setting = {"batch": 2, "sequence": 128}
    reference = reference_outputs(dynamic_block, [setting])
    result = compare_with_reference(reference, wrong)
    assert not result.passed and result.outputs, result.reason
    (output,) = result.outputs
    assert output.beyond <= FLIP_FRACTION * np.prod(output.shape) and output.flipped_at is None
    assert reference._fresh_runs  # judged again, and failed again at the same places


@pytest.mark.parametrize("wrong_op", ["clip", "shift"])
def test_a_wrong_value_at_a_few_input_dependent_places_is_a_mismatch(dynamic_block, wrong_op):
    """The largest 0.3% of the output clipped, or moved by 100: few elements, at other places on
    other inputs, but each by far more than a rounding flip moves one (FLIP_STEPS)."""
    setting = {"batch": 2, "sequence": 64}
    reference = reference_outputs(dynamic_block, [setting])
    (_, _, expected), = reference.runs
    top = np.float32(np.quantile(expected["output"], 0.997))
    helper = onnx.helper
    nodes = ([helper.make_node("Min", ["inner", "top"], ["output"])] if wrong_op == "clip" else
             [helper.make_node("Greater", ["inner", "top"], ["above"]),
              helper.make_node("Add", ["inner", "hundred"], ["moved"]),
              helper.make_node("Where", ["above", "moved", "inner"], ["output"])])
    wrong = _with_output_rewritten(dynamic_block, nodes, {"top": top, "hundred": np.float32(100)})
    result = compare_with_reference(reference, wrong)
    assert not result.passed
    (output,) = result.outputs
    assert 0 < output.beyond <= FLIP_FRACTION * np.prod(output.shape) and output.flipped_at is None


def test_tolerances_the_user_gives_get_no_second_look(dynamic_block, tmp_path):
    fused = optimize_model(dynamic_block, tmp_path, target="ort-cpu", allow_peak_growth=False).model
    reference = reference_outputs(dynamic_block, [FLIP_SETTING])
    result = compare_with_reference(reference, fused, rtol=1e-4, atol=1e-5)
    assert not result.passed and not reference._fresh_runs


def test_a_crash_on_the_second_look_leaves_the_mismatch(dynamic_block, tmp_path, monkeypatch):
    """onnxruntime crashing on the fresh inputs is no pass: the first look's verdict stands."""
    from fuse_cli import verify
    from fuse_cli.core.isolation import RuntimeCrash

    fused = optimize_model(dynamic_block, tmp_path, target="ort-cpu", allow_peak_growth=False).model
    reference = reference_outputs(dynamic_block, [FLIP_SETTING])
    first_look = verify._candidate_outcomes
    calls = []

    def crash_the_second(*args):
        calls.append(args)
        if len(calls) > 1:
            raise RuntimeCrash("onnxruntime crashed (SIGSEGV)")
        return first_look(*args)

    monkeypatch.setattr(verify, "_candidate_outcomes", crash_the_second)
    result = compare_with_reference(reference, fused)
    assert len(calls) == 2 and not result.passed


def test_a_float_model_gets_no_second_look():
    block = onnx.load(SAMPLES / "transformer_block_opset17.onnx")
    assert reference_outputs(block, SETTINGS[1:]).fresh is None
