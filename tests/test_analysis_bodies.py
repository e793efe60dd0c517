"""The memory estimate of If, Loop and Scan bodies (fuse_cli/analysis/bodies.py) against the
allocator's exact peak in onnxruntime, and the branch it says it counted.

Models are built here at sizes whose peak is 1-16 MiB: activations are float32 [256, 512]
(512 KiB, "T") unless noted. Bodies declare their own symbol (`n`) where the outer graph binds
`N`, as exporters write them: the estimate must size them from the outer shapes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.report.render import body_note

FLOAT = TensorProto.FLOAT
D = 512
N = 256
T = N * D * 4
MIB = 1 << 20


def value(name, shape=None, elem_type=FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def weight(name, rows=D, cols=D, seed=0):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal((rows, cols)) * 0.02).astype(np.float32), name)


def model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)])


def body(nodes, outputs, inputs=(), initializers=()):
    return helper.make_graph(nodes, "body", list(inputs), list(outputs), list(initializers))


def if_model(condition_nodes, condition_inputs, then_branch, else_branch, initializers=()):
    nodes = [helper.make_node("Relu", ["inp"], ["x"], name="relu"), *condition_nodes,
             helper.make_node("If", ["cond"], ["y"], name="if_0", then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Mul", ["y", "y"], ["out"], name="square")]
    return model(nodes, [value("inp", ["N", D]), *condition_inputs], [value("out", ["N", D])], initializers)


def big_then_branch():
    """Four T-sized activations alive at once at its Add: t1 (read last there), t3, t6 and the output."""
    return body([
        helper.make_node("MatMul", ["x", "w"], ["t1"]), helper.make_node("Relu", ["t1"], ["t2"]),
        helper.make_node("MatMul", ["t2", "w"], ["t3"]), helper.make_node("Concat", ["t1", "t3"], ["t4"], axis=1),
        helper.make_node("Sigmoid", ["t4"], ["t5"]), helper.make_node("Slice", ["t5", "start", "end", "axis"], ["t6"]),
        helper.make_node("Add", ["t6", "t3"], ["then_out"])],
        [value("then_out", ["n", D])],
        initializers=[numpy_helper.from_array(np.array([v], np.int64), name)
                      for name, v in (("start", 0), ("end", D), ("axis", 1))])


def small_else_branch():
    return body([helper.make_node("Neg", ["x"], ["else_out"])], [value("else_out", ["n", D])])


def selected_by_input():
    """cond = (k == 1), k an int64 graph input: unknown to the estimate, fed 1 when measured."""
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    return [helper.make_node("Equal", ["k", "one"], ["cond"], name="equal")], [value("k", [], TensorProto.INT64)], [one]


def allocated(m, **kwargs) -> int:
    result = measure_peak(m, dims={"N": N}, **kwargs)
    if result.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {result.allocated_reason or result.reason}")
    return result.allocated_bytes


def estimate(m):
    return profile_memory(m, infer_shapes(m, dims={"N": N}))


def assert_close(estimated: int, measured: int):
    assert 1 * MIB <= measured <= 16 * MIB, measured
    assert abs(estimated - measured) <= 0.15 * measured, (estimated / MIB, measured / MIB)


def test_if_counts_the_larger_branch_where_the_condition_is_unknown():
    condition, inputs, constants = selected_by_input()
    m = if_model(condition, inputs, big_then_branch(), small_else_branch(), [weight("w"), *constants])
    profile = estimate(m)
    (cost,) = profile.bodies
    assert (cost.node, cost.counted, cost.reason) == ("if_0", "then_branch", "larger")
    assert (cost.body_peak, cost.other_peak) == (4 * T, T)
    # inp and x, and the branch's peak in place of the If's output
    assert (profile.peak_node, profile.peak_bytes) == ("if_0", 2 * T + 4 * T + 8 + 1)  # k and cond
    assert body_note(cost) == "If 'if_0': counted then_branch (larger, 2.0 MiB; the other branch 512.0 KiB)"
    assert_close(profile.peak_bytes, allocated(m, int_ranges={"k": (1, 2)}))


def test_if_counts_the_taken_branch_where_the_condition_is_a_constant():
    condition = [helper.make_node("Constant", [], ["cond"], name="const",
                                  value=numpy_helper.from_array(np.array(False)))]
    m = if_model(condition, [], big_then_branch(), small_else_branch(), [weight("w")])
    profile = estimate(m)
    (cost,) = profile.bodies
    assert (cost.counted, cost.reason) == ("else_branch", "the condition is a constant false")
    assert profile.peak_bytes == 3 * T  # inp, x, y: Neg writes into the If's output
    assert "counted else_branch (the condition is a constant false" in body_note(cost)
    assert_close(profile.peak_bytes, allocated(m))


def test_if_whose_branches_read_outer_weights_and_activations():
    """Both branches read the outer x and their own outer weight (the T5 merged decoder's shape):
    those stay counted once, in the outer walk, up to the If."""
    then_branch = body([helper.make_node("MatMul", ["x", "w_then"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
                        helper.make_node("MatMul", ["b", "w_then"], ["c"]),
                        helper.make_node("Add", ["c", "x"], ["then_out"])],
                       [value("then_out", ["n", D])])
    else_branch = body([helper.make_node("MatMul", ["x", "w_else"], ["else_out"])], [value("else_out", ["n", D])])
    condition, inputs, constants = selected_by_input()
    m = if_model(condition, inputs, then_branch, else_branch, [weight("w_then"), weight("w_else", seed=1), *constants])
    profile = estimate(m)
    assert profile.bodies[0].counted == "then_branch"
    assert_close(profile.peak_bytes, allocated(m, int_ranges={"k": (1, 2)}))


def loop_model(trips=8):
    loop_body = body([
        helper.make_node("Identity", ["c_in"], ["c_out"]),
        helper.make_node("MatMul", ["acc_in", "w"], ["mm"]), helper.make_node("Tanh", ["mm"], ["th"]),
        helper.make_node("Add", ["th", "acc_in"], ["acc_out"]), helper.make_node("Relu", ["acc_out"], ["scan_out"])],
        [value("c_out", [], TensorProto.BOOL), value("acc_out", ["n", D]), value("scan_out", ["n", D])],
        inputs=[value("i", [], TensorProto.INT64), value("c_in", [], TensorProto.BOOL), value("acc_in", ["n", D])])
    nodes = [helper.make_node("Relu", ["inp"], ["x"], name="relu"),
             helper.make_node("Loop", ["trips", "", "x"], ["acc", "scans"], name="loop_0", body=loop_body),
             helper.make_node("Add", ["acc", "x"], ["out"], name="add")]
    trip_count = numpy_helper.from_array(np.array(trips, np.int64), "trips")
    return model(nodes, [value("inp", ["N", D])], [value("out", ["N", D]), value("scans", [None, "N", D])],
                 [weight("w"), trip_count])


def test_loop_counts_one_iteration_and_every_iteration_s_scan_output():
    m = loop_model()
    profile = estimate(m)
    (cost,) = profile.bodies
    assert cost.iterations == 8
    # onnx leaves the Loop's outputs unknown; the body sizes them: acc T, scans 8 T
    assert not profile.unknown_tensors
    # at the end: inp, x, both outputs, the last two iterations' carried values and 8 pieces
    assert profile.peak_bytes == 2 * T + 9 * T + 2 * T + 8 * T
    assert body_note(cost) == ("Loop 'loop_0': counted one iteration of its body (1.0 MiB) "
                               "and the buffers of 8 iterations")
    assert_close(profile.peak_bytes, allocated(m))


def scan_model(hidden=256, input_axis=0, output_axis=0):
    rnn = body([
        helper.make_node("MatMul", ["x_t", "wx"], ["a"]), helper.make_node("MatMul", ["h_in", "wh"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Tanh", ["c"], ["h_out"]),
        helper.make_node("Identity", ["h_out"], ["y_t"])],
        [value("h_out", ["b", hidden]), value("y_t", ["b", hidden])],
        inputs=[value("h_in", ["b", hidden]), value("x_t", ["b", hidden])])
    nodes = [helper.make_node("Relu", ["inp"], ["xs"], name="relu"),
             helper.make_node("Scan", ["h0", "xs"], ["h_last", "ys"], name="scan_0", body=rnn, num_scan_inputs=1,
                              scan_input_axes=[input_axis], scan_output_axes=[output_axis]),
             helper.make_node("Relu", ["ys"], ["out"], name="relu_out")]
    sequence = ["S", "B", hidden] if input_axis == 0 else ["B", "S", hidden]
    return model(nodes, [value("inp", sequence), value("h0", ["B", hidden])],
                 [value("out"), value("h_last", ["B", hidden])],
                 [weight("wx", hidden, hidden), weight("wh", hidden, hidden, seed=1)])


def test_scan_counts_one_step_and_its_state_buffers():
    m = scan_model()
    shapes = infer_shapes(m, dims={"S": 64, "B": 16})
    profile = profile_memory(m, shapes)
    (cost,) = profile.bodies
    step = 16 * 256 * 4
    assert cost.iterations == 64
    # one step: a and b alive at the Add, then c; outputs written into the Scan's (left out)
    assert cost.body_peak == 3 * step
    assert cost.scratch_bytes == 3 * step + 2 * step  # plus the two state buffers
    result = measure_peak(m, dims={"S": 64, "B": 16})
    if result.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {result.allocated_reason or result.reason}")
    assert_close(profile.peak_bytes, result.allocated_bytes)


@pytest.mark.parametrize("input_axis, output_axis", [(1, 0), (0, 1), (1, 1)])
def test_scan_along_another_axis_counts_the_transposed_copies(input_axis, output_axis):
    """tf2onnx's RNNs scan [B, S, F] along axis 1: Scan transposes such an input into a copy,
    and writes such an output into a temporary it transposes at the end."""
    m = scan_model(input_axis=input_axis, output_axis=output_axis)
    shapes = infer_shapes(m, dims={"S": 64, "B": 16})
    profile = profile_memory(m, shapes)
    plain = profile_memory(scan_model(), infer_shapes(scan_model(), dims={"S": 64, "B": 16}))
    copies = (input_axis != 0) + (output_axis != 0)
    assert profile.bodies[0].scratch_bytes == plain.bodies[0].scratch_bytes + copies * 64 * 16 * 256 * 4
    result = measure_peak(m, dims={"S": 64, "B": 16})
    if result.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {result.allocated_reason or result.reason}")
    assert_close(profile.peak_bytes, result.allocated_bytes)


def test_nested_if_inside_a_loop_body_is_counted():
    inner_then = body([helper.make_node("MatMul", ["acc_in", "w"], ["p"]), helper.make_node("Tanh", ["p"], ["q"]),
                       helper.make_node("Add", ["p", "q"], ["then_out"])], [value("then_out", ["n", D])])
    inner_else = body([helper.make_node("Neg", ["acc_in"], ["else_out"])], [value("else_out", ["n", D])])
    loop_body = body([
        helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Greater", ["i", "zero"], ["gt"]),
        helper.make_node("If", ["gt"], ["acc_out"], name="inner_if", then_branch=inner_then, else_branch=inner_else)],
        [value("c_out", [], TensorProto.BOOL), value("acc_out", ["n", D])],
        inputs=[value("i", [], TensorProto.INT64), value("c_in", [], TensorProto.BOOL), value("acc_in", ["n", D])])
    nodes = [helper.make_node("Relu", ["inp"], ["x"], name="relu"),
             helper.make_node("Loop", ["trips", "", "x"], ["acc"], name="loop_0", body=loop_body),
             helper.make_node("Add", ["acc", "x"], ["out"], name="add")]
    m = model(nodes, [value("inp", ["N", D])], [value("out", ["N", D])],
              [weight("w"), numpy_helper.from_array(np.array(4, np.int64), "trips"),
               numpy_helper.from_array(np.array(0, np.int64), "zero")])
    profile = estimate(m)
    (loop,) = profile.bodies
    assert loop.body_peak >= 3 * T  # the inner then_branch's p, q and output
    assert_close(profile.peak_bytes, allocated(m))


def test_an_unknown_trip_count_is_said():
    m = loop_model()
    m.graph.input.append(value("trips", [], TensorProto.INT64))
    del m.graph.initializer[1]
    profile = estimate(m)
    (cost,) = profile.bodies
    assert cost.iterations is None and "scans" in profile.unknown_tensors
    assert "the iteration count is unknown" in body_note(cost)


def test_a_nested_if_decided_by_shapes_sizes_what_reads_it():
    """silero-vad's form: inside a branch, If(Shape(h)[0] == 1) passes h on or squeezes it, so
    onnx leaves its output's rank unknown; at the bound dims shape arithmetic decides it, and the
    LSTM reading it is sized (with its gate buffers: 4 S + 3 [B, H] per direction)."""
    hidden = 256
    squeeze = body([helper.make_node("Squeeze", ["h", "zero_axis"], ["squeezed"])], [value("squeezed")])
    keep = body([helper.make_node("Identity", ["h"], ["kept"])], [value("kept")])
    rng = np.random.default_rng(0)
    lstm_weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
                    for name, shape in (("W", (1, 4 * hidden, D)), ("R", (1, 4 * hidden, hidden)))]
    then_branch = body([
        helper.make_node("Unsqueeze", ["x", "zero_axis"], ["h"]),  # [1, N, D]: a one-step sequence
        helper.make_node("Shape", ["h"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["first"]),
        helper.make_node("Equal", ["first", "one_step"], ["is_one"]),
        helper.make_node("If", ["is_one"], ["seq"], name="inner_if", then_branch=keep, else_branch=squeeze),
        helper.make_node("LSTM", ["seq", "W", "R"], ["", "h_last"], hidden_size=hidden),
        helper.make_node("Squeeze", ["h_last", "zero_axis"], ["h2"]),
        helper.make_node("MatMul", ["h2", "back"], ["then_out"])],
        [value("then_out", ["n", D])],
        initializers=[*lstm_weights, weight("back", hidden, D),
                      numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
                      numpy_helper.from_array(np.array(0, np.int64), "zero"),
                      numpy_helper.from_array(np.array(1, np.int64), "one_step")])
    condition, inputs, constants = selected_by_input()
    m = if_model(condition, inputs, then_branch, small_else_branch(), constants)
    profile = estimate(m)
    (cost,) = profile.bodies
    assert cost.counted == "then_branch" and not cost.unknown
    step = N * hidden * 4
    assert cost.body_peak >= (4 + 3) * step  # the LSTM's gate and state buffers
    assert_close(profile.peak_bytes, allocated(m, int_ranges={"k": (1, 2)}))


def test_report_measure_takes_the_branch_an_input_names(tmp_path):
    """`fuse report --measure` on silero-vad's form, If(Equal(sr, 16000)): fed at random, sr takes
    the else branch, which cannot run at these shapes (a Reshape to rows of 3), and onnxruntime's
    failure ended the report with exit 2; the measurement feeds sr the constant it is compared
    with, so the branch the model names runs, and the estimate counts it (the else branch cannot
    be sized here)."""
    sixteen_k = numpy_helper.from_array(np.array(16000, np.int64), "rate")
    rows_of_three = numpy_helper.from_array(np.array([-1, 3], np.int64), "rows_of_three")
    then_branch = body([helper.make_node("MatMul", ["x", "w_branch"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
                        helper.make_node("Add", ["a", "b"], ["then_out"])],
                       [value("then_out", ["n", D])], initializers=[weight("w_branch")])
    else_branch = body([helper.make_node("Reshape", ["x", "rows_of_three"], ["else_out"])], [value("else_out")],
                       initializers=[rows_of_three])
    condition = [helper.make_node("Equal", ["sr", "rate"], ["cond"], name="equal")]
    m = if_model(condition, [value("sr", [], TensorProto.INT64)], then_branch, else_branch, [sixteen_k])
    path = tmp_path / "vad_like.onnx"
    onnx.save(m, path)
    from fuse_cli import api
    from fuse_cli.config import FuseConfig
    report = api.optimize(path, FuseConfig(verify=False, measure=True, dims={"N": N}), dry_run=True).report
    (cost,) = report.memory.before.bodies
    assert (cost.counted, cost.reason) == ("then_branch", "larger")
    measured = report.measured.before
    if measured.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {measured.allocated_reason or measured.reason}")
    assert_close(report.memory.before.peak_bytes, measured.allocated_bytes)


def test_a_branch_reads_the_outer_graph_s_small_constants_as_values():
    """silero-vad's opset-18 export pads its input inside the branch with pads stored in the outer
    graph: the branch is inferred with them as values, so the Pad and what follows it are sized."""
    pads = numpy_helper.from_array(np.array([0, 64, 0, 64], np.int64), "outer_pads")
    then_branch = body([helper.make_node("Pad", ["x", "outer_pads"], ["padded"]),
                        helper.make_node("Tanh", ["padded"], ["t"]),
                        helper.make_node("Slice", ["t", "start", "end", "axis"], ["then_out"])],
                       [value("then_out", ["n", D])],
                       initializers=[numpy_helper.from_array(np.array([v], np.int64), name)
                                     for name, v in (("start", 64), ("end", 64 + D), ("axis", 1))])
    condition, inputs, constants = selected_by_input()
    m = if_model(condition, inputs, then_branch, small_else_branch(), [pads, *constants])
    profile = estimate(m)
    (cost,) = profile.bodies
    assert cost.counted == "then_branch" and not cost.unknown
    padded = N * (D + 128) * 4
    assert cost.body_peak == padded + T  # Tanh in place on the Pad's output, then the Slice's
    assert_close(profile.peak_bytes, allocated(m, int_ranges={"k": (1, 2)}))


@pytest.mark.parametrize("batch, steps, hidden, features, outputs, initial, direction", [
    (256, 4, 128, 128, ("y", "y_h", "y_c"), True, "forward"),
    (64, 8, 128, 96, ("y", "", ""), False, "forward"),
    (64, 4, 128, 96, ("", "y_h"), True, "forward"),
    (64, 8, 128, 96, ("y", "y_h", "y_c"), False, "bidirectional"),
])
def test_lstm_scratch_matches_the_allocator(batch, steps, hidden, features, outputs, initial, direction):
    """The LSTM of RNN bodies (silero-vad's decoder): its gate and state buffers (memory.py's
    _lstm_workspace) within 2% of the allocator's exact peak."""
    directions = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((directions, 4 * hidden, features)) * 0.1).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((directions, 4 * hidden, hidden)) * 0.1).astype(np.float32), "R")
    states = [value(name, [directions, batch, hidden]) for name in ("h0", "c0")] if initial else []
    node_inputs = ["x", "W", "R"] + (["", "", "h0", "c0"] if initial else [])
    m = model([helper.make_node("LSTM", node_inputs, list(outputs), hidden_size=hidden, direction=direction)],
              [value("x", [steps, batch, features]), *states], [value(name) for name in outputs if name], [w, r])
    estimated = profile_memory(m, infer_shapes(m)).peak_bytes
    result = measure_peak(m)
    if result.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {result.allocated_reason or result.reason}")
    assert abs(estimated - result.allocated_bytes) <= 0.02 * result.allocated_bytes, (estimated, result.allocated_bytes)
