"""qlinear-conv and qlinear-matmul: whole QDQ node units become the standard QLinearConv and
QLinearMatMul, within one quantization step of the unit they replace; what is not a whole unit
(or not one the kernels take) stays, with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from fuse_cli.verify import (QUANTIZED_OUTPUT_STEPS, compare_outputs, make_session, quantized_output_steps,
                              random_inputs, verify_models)
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

QMIN = {np.uint8: 0, np.int8: -128}


class QdqUnit:
    """One QDQ unit as a static quantizer writes it, its parameters computed from the values as a
    calibrated quantizer computes them: activations asymmetric over the calibration range,
    weights symmetric int8 (or uint8 about 128), per tensor or per output channel; the bias int32 at
    x_scale * w_scale. Weights are perturbed normal values, not round numbers, on 7 bits
    (quantize_static's reduce_range) unless `full_range`: onnxruntime's u8 x s8 kernel saturates
    full-range weights on x86 CPUs without VNNI (its own formed QLinearConv too)."""

    def __init__(self, seed: int = 0, *, activation=np.uint8, weight=np.int8, full_range: bool = False):
        self.b = GraphBuilder(opset=17, seed=seed)
        self.activation, self.weight = activation, weight
        self.weight_max = 127 if full_range else 63

    def qdq(self, x: str, low: float, high: float, dtype=None) -> tuple[str, float]:
        """x quantized and dequantized over [low, high]; returns the DQ output and its scale."""
        dtype = dtype or self.activation
        scale = np.float32((high - low) / 255)
        zero = dtype(np.clip(round(QMIN[dtype] - low / scale), QMIN[dtype], QMIN[dtype] + 255))
        s, z = self.b.const(scale), self.b.const(zero, dtype=dtype)
        return self.b.op("DequantizeLinear", self.b.op("QuantizeLinear", x, s, z), s, z), float(scale)

    def weight_dq(self, w: np.ndarray, axis: int | None) -> tuple[str, np.ndarray]:
        """DQ of w quantized per tensor (axis None) or along `axis`; returns it and the scales."""
        reduce = tuple(i for i in range(w.ndim) if i != axis) if axis is not None else None
        scale = (np.abs(w).max(axis=reduce) / self.weight_max).astype(np.float32)
        shape = [-1 if i == axis else 1 for i in range(w.ndim)] if axis is not None else []
        centre = 0 if self.weight == np.int8 else 128
        q = np.clip(np.round(w / scale.reshape(shape)) + centre, QMIN[self.weight], QMIN[self.weight] + 255)
        zero = np.full(scale.shape, centre, self.weight)
        attrs = {"axis": axis} if axis is not None else {}
        dq = self.b.op("DequantizeLinear", self.b.const(q.astype(self.weight)), self.b.const(scale),
                       self.b.const(zero), **attrs)
        return dq, scale

    def bias_dq(self, bias: np.ndarray, scale: np.ndarray) -> str:
        q = np.round(bias / scale).astype(np.int32)
        return self.b.op("DequantizeLinear", self.b.const(q), self.b.const(scale.astype(np.float32)),
                         self.b.const(np.zeros(scale.shape, np.int32)), **({"axis": 0} if scale.size > 1 else {}))

    def output(self, y: str, low: float, high: float, *, relu: bool = False) -> str:
        if relu:
            y, low = self.b.op("Relu", y), 0.0  # calibrated after the Relu: the zero point is qmin
        out, _ = self.qdq(y, low, high)
        return out


def conv_unit(*, per_channel=True, bias=True, relu=False, activation=np.uint8, weight=np.int8, seed=0,
              bias_scale_factor=1.0, shared_input=False, conv_read_twice=False, q_read_twice=False,
              weight_input=False, full_range=False) -> onnx.ModelProto:
    u = QdqUnit(seed, activation=activation, weight=weight, full_range=full_range)
    x, x_scale = u.qdq(u.b.input("x", ["batch", 8, 9, 9]), -3.0, 3.0)
    w = u.b.rng.standard_normal((6, 8, 3, 3)).astype(np.float32) * np.linspace(0.05, 0.2, 6).reshape(6, 1, 1, 1)
    if weight_input:
        q = u.b.input("w_q", [6, 8, 3, 3], onnx.TensorProto.INT8)
        w_scale = np.float32([0.01])
        w_dq = u.b.op("DequantizeLinear", q, u.b.const(w_scale[0]), u.b.const(np.int8(0), dtype=np.int8))
    else:
        w_dq, w_scale = u.weight_dq(w, 0 if per_channel else None)
    inputs = [x, w_dq]
    if bias:
        inputs.append(u.bias_dq(u.b.rng.standard_normal(6).astype(np.float32) * 0.3,
                                np.float32(x_scale) * w_scale * np.float32(bias_scale_factor)))
    conv = u.b.op("Conv", *inputs, pads=[1, 1, 1, 1], name="conv")
    y = u.output(conv, -6.0, 6.0, relu=relu)
    outputs = [y]
    if shared_input:
        outputs.append(u.b.op("Relu", x))  # the input's DequantizeLinear read by another node too
    if conv_read_twice:
        outputs.append(u.b.op("Sigmoid", conv))
    if q_read_twice:
        q_out = next(n for n in u.b.nodes if n.op_type == "DequantizeLinear" and n.output[0] == y).input[0]
        outputs.append(u.b.op("DequantizeLinear", q_out, u.b.const(np.float32(12 / 255)),
                              u.b.const(np.uint8(128) if activation == np.uint8 else np.int8(0),
                                        dtype=activation)))
    names = ["y", "second", "third"][: len(outputs)]
    return u.b.build(*outputs, output_names=names)


def matmul_unit(*, per_column=True, activation=np.uint8, weight=np.int8, computed_b=False, seed=1) -> onnx.ModelProto:
    u = QdqUnit(seed, activation=activation, weight=weight)
    a, _ = u.qdq(u.b.input("a", ["batch", "sequence", 16]), -2.0, 2.5)
    if computed_b:  # attention's scores: both operands computed
        b, _ = u.qdq(u.b.input("k", ["batch", 16, "sequence"]), -2.0, 2.0)
    else:
        w = u.b.rng.standard_normal((16, 12)).astype(np.float32) * 0.25
        b, _ = u.weight_dq(w, 1 if per_column else None)
    y = u.output(u.b.op("MatMul", a, b, name="matmul"), -6.0, 6.0)
    return u.b.build(y, output_names=["y"])


def within_one_step(original: onnx.ModelProto, formed: onnx.ModelProto, dims: dict, step: float, seed: int = 0):
    """Every output within `step`: a single unit's quantized kernel rounds differently at most once,
    so at most one step; a move is exact (0)."""
    feeds = random_inputs(make_session(original), dims=dims, seed=seed)
    for want, got in zip(make_session(original).run(None, feeds), make_session(formed).run(None, feeds)):
        assert np.abs(want.astype(np.float64) - got).max() <= step * 1.001


SETTINGS = ({"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 7})


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("activation,weight", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)],
                         ids=["u8-s8", "u8-u8", "s8-s8"])
@pytest.mark.parametrize("bias,relu", [(True, False), (False, False), (True, True)], ids=["bias", "no-bias", "relu"])
def test_a_conv_unit_becomes_qlinearconv(tmp_path, target, per_channel, activation, weight, bias, relu):
    model = conv_unit(per_channel=per_channel, bias=bias, relu=relu, activation=activation, weight=weight)
    result = optimize_model(model, tmp_path, target=target, passes=("qlinear-conv",))
    counts = op_counts(result.model)
    assert counts["QLinearConv"] == 1 and "Conv" not in counts and "Relu" not in counts, counts
    assert counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 1  # the input's Q, the output's DQ
    close_at_every_setting(model, result.model)


def close_at_every_setting(model: onnx.ModelProto, formed: onnx.ModelProto) -> None:
    """Within one step of the output scale, and verified, at each of SETTINGS."""
    for index, dims in enumerate(SETTINGS):
        within_one_step(model, formed, dims, 12 / 255, seed=index)
        assert_equivalent(model, formed, dims=dims, seeds=(index,))


@pytest.mark.parametrize("per_column", [True, False], ids=["per-column", "per-tensor"])
@pytest.mark.parametrize("activation,weight", [(np.uint8, np.int8), (np.int8, np.int8)], ids=["u8-s8", "s8-s8"])
@pytest.mark.parametrize("computed_b", [False, True], ids=["weight", "computed"])
def test_a_matmul_unit_becomes_qlinearmatmul(tmp_path, per_column, activation, weight, computed_b):
    model = matmul_unit(per_column=per_column, activation=activation, weight=weight, computed_b=computed_b)
    result = optimize_model(model, tmp_path, passes=("qlinear-matmul",))
    counts = op_counts(result.model)
    assert counts["QLinearMatMul"] == 1 and "MatMul" not in counts, counts
    close_at_every_setting(model, result.model)


def test_full_range_s8_weights_give_what_onnxruntimes_own_kernel_gives(tmp_path):
    """Full-range s8 weights against u8 activations: on x86 CPUs without VNNI the kernel's int16
    pair sums saturate (11 steps off the float unit here); onnxruntime's own QLinearConv, formed at
    ORT_ENABLE_EXTENDED (and ALL, its default), gives the same values: fuse writes the same kernel."""
    model = conv_unit(full_range=True)
    result = optimize_model(model, tmp_path, passes=("qlinear-conv",))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    onnxruntimes = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        feeds = random_inputs(make_session(model), dims={"batch": 2}, seed=seed)
        np.testing.assert_array_equal(make_session(result.model).run(None, feeds)[0], onnxruntimes.run(None, feeds)[0])
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_a_dequantize_read_by_another_node_stays_for_it(tmp_path):
    """onnxruntime gives each unit its own copy of a shared DequantizeLinear; so does the pass:
    QLinearConv reads the quantized input, and the Relu still reads the DequantizeLinear."""
    model = conv_unit(shared_input=True)
    result = optimize_model(model, tmp_path, passes=("qlinear-conv",))
    counts = op_counts(result.model)
    assert counts["QLinearConv"] == 1 and counts["DequantizeLinear"] == 2  # x's, kept for the Relu; y's
    (relu,) = [n for n in result.model.graph.node if n.op_type == "Relu"]
    producer = {o: n for n in result.model.graph.node for o in n.output}
    assert producer[relu.input[0]].op_type == "DequantizeLinear"
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_a_quantized_output_read_twice_is_formed_once(tmp_path):
    """Every reader of the QuantizeLinear's output reads the QLinearConv's: the same tensor."""
    model = conv_unit(q_read_twice=True)
    result = optimize_model(model, tmp_path, passes=("qlinear-conv",))
    assert op_counts(result.model)["QLinearConv"] == 1
    assert_equivalent(model, result.model, dims={"batch": 2})


@pytest.mark.parametrize("variant,reason", [
    ({"conv_read_twice": True}, "is also read by"),
    ({"weight_input": True}, "is a graph input, not a constant"),
    ({"bias_scale_factor": 1.5}, "bias scale is not x_scale * w_scale"),
    ({"activation": np.int8, "weight": np.uint8}, "no quantized kernel for x int8, w uint8, output int8"),
])
def test_what_is_not_a_whole_unit_stays(tmp_path, variant, reason):
    model = conv_unit(**variant)
    result = optimize_model(model, tmp_path, passes=("qlinear-conv",))
    assert_declined(model, result, "qlinear-conv", reason)


def test_a_relu_the_quantization_does_not_make_redundant_stays(tmp_path):
    """Relu then Q with a zero point above qmin: dropping the Relu would keep negative values."""
    u = QdqUnit(2)
    x, _ = u.qdq(u.b.input("x", ["batch", 8, 9, 9]), -3.0, 3.0)
    w, scale = u.weight_dq(u.b.rng.standard_normal((6, 8, 3, 3)).astype(np.float32) * 0.1, 0)
    y, _ = u.qdq(u.b.op("Relu", u.b.op("Conv", x, w, name="conv"), name="relu"), -1.0, 6.0)
    model = u.b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("qlinear-conv",))
    assert_declined(model, result, "qlinear-conv", "relu clamps at 0 but")


def test_cuda_targets_keep_the_unit(tmp_path):
    """The standard QLinearConv's CUDA kernel is not checked: targets that may run on CUDA keep it."""
    model = conv_unit()
    result = optimize_model(model, tmp_path, target="ort-cuda", passes=("qlinear-conv",))
    assert_declined(model, result, "qlinear-conv", "CUDA kernel in the pinned onnxruntime-gpu is not checked")


def test_a_second_run_forms_nothing(tmp_path):
    result = optimize_model(conv_unit(), tmp_path, passes=("qlinear-conv", "qlinear-matmul"))
    again = optimize_model(result.model, tmp_path, name="again", passes=("qlinear-conv", "qlinear-matmul"))
    assert not again.report.fusions


# ---- verification: an output a DequantizeLinear writes is judged in steps of its scale

def test_the_step_of_a_dequantized_output_is_its_scale():
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 4])
    scale = b.const(np.float32([0.02, 0.05, 0.01, 0.03]))
    q = b.op("QuantizeLinear", x, scale, b.const(np.zeros(4, np.uint8)), axis=1)
    model = b.build(b.op("DequantizeLinear", q, scale, b.const(np.zeros(4, np.uint8)), axis=1), b.op("Relu", x),
                    output_names=["quantized", "float"])
    assert quantized_output_steps(model.graph) == pytest.approx({"quantized": 0.05})


def test_a_dequantized_output_passes_within_the_steps_and_a_float_one_keeps_its_tolerance():
    step = 0.05
    want = np.linspace(-3, 3, 64, dtype=np.float32)
    near, far = want + 3 * step, want + (QUANTIZED_OUTPUT_STEPS + 2) * step
    assert compare_outputs({"y": want}, {"y": near}, steps={"y": step}).passed
    assert not compare_outputs({"y": want}, {"y": far}, steps={"y": step}).passed
    assert not compare_outputs({"y": want}, {"y": near}).passed  # no step: the float tolerance


def test_verification_catches_per_channel_scales_read_as_one(tmp_path):
    """The bug a hand-written rewrite is most likely to have: QLinearConv given the first channel's
    weight scale for every channel (0.05 against up to 0.2 here) is far outside the steps."""
    model = conv_unit()
    result = optimize_model(model, tmp_path, passes=("qlinear-conv",))
    wrong = onnx.ModelProto()
    wrong.CopyFrom(result.model)
    (node,) = [n for n in wrong.graph.node if n.op_type == "QLinearConv"]
    (scale,) = [t for t in wrong.graph.initializer if t.name == node.input[4]]
    values = onnx.numpy_helper.to_array(scale)
    scale.CopyFrom(onnx.numpy_helper.from_array(np.full_like(values, values[0]), scale.name))
    assert verify_models(model, result.model, dims={"batch": 2}).passed
    assert not verify_models(model, wrong, dims={"batch": 2}).passed


# ---- drop-qdq-pairs: a node that moves elements runs on the quantized values

def move_between_pair(op: str, *, requantize: float = 1.0, dtype=np.uint8, read_twice: bool = False):
    u = QdqUnit(3, activation=dtype)
    x, scale = u.qdq(u.b.input("x", ["batch", 4, 6]), -2.0, 3.0)
    extra = {"Reshape": lambda: [u.b.const(np.int64([0, 6, 4]), dtype=np.int64)],
             "Transpose": lambda: [], "Flatten": lambda: [],
             "Unsqueeze": lambda: [u.b.const(np.int64([1]), dtype=np.int64)],
             "Slice": lambda: [u.b.const(np.int64([1]), dtype=np.int64), u.b.const(np.int64([5]), dtype=np.int64),
                               u.b.const(np.int64([2]), dtype=np.int64)],
             "Gather": lambda: [u.b.const(np.int64([2, 0, 3]), dtype=np.int64)]}[op]()
    attrs = {"Transpose": {"perm": [0, 2, 1]}, "Gather": {"axis": 1}}.get(op, {})
    moved = u.b.op(op, x, *extra, name="move", **attrs)
    zero = next(n for n in u.b.nodes if n.op_type == "QuantizeLinear").input[2]
    y_scale = u.b.const(np.float32(scale * requantize))
    y = u.b.op("DequantizeLinear", u.b.op("QuantizeLinear", moved, y_scale, zero), y_scale, zero)
    outputs = [u.b.op("Relu", y)] + ([u.b.op("Sigmoid", x)] if read_twice else [])
    return u.b.build(*outputs, output_names=["y", "second"][: len(outputs)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("op", ["Reshape", "Transpose", "Flatten", "Unsqueeze", "Slice", "Gather"])
def test_a_move_between_a_pair_of_one_scale_runs_on_the_quantized_values(tmp_path, op, dtype):
    model = move_between_pair(op, dtype=dtype)
    result = optimize_model(model, tmp_path, passes=("drop-qdq-pairs",))
    counts = op_counts(result.model)
    assert counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 1 and counts[op] == 1, counts
    for index, dims in enumerate(SETTINGS):
        within_one_step(model, result.model, dims, 0.0, seed=index)  # exact: not a step off anywhere


def test_a_pair_that_requantizes_stays(tmp_path):
    model = move_between_pair("Transpose", requantize=1.5)
    result = optimize_model(model, tmp_path, passes=("drop-qdq-pairs",))
    assert_declined(model, result, "drop-qdq-pairs", "requantizes to another scale or zero point")


def test_the_dequantize_before_a_move_stays_for_its_other_reader(tmp_path):
    model = move_between_pair("Reshape", read_twice=True)
    result = optimize_model(model, tmp_path, passes=("drop-qdq-pairs",))
    counts = op_counts(result.model)
    assert counts["QuantizeLinear"] == 1 and counts["DequantizeLinear"] == 2, counts
    within_one_step(model, result.model, {"batch": 2}, 0.0)


# ---- qgemm (onnxruntime targets): a QDQ Gemm unit -> com.microsoft QGemm

def gemm_unit(*, trans_b=True, per_column=True, bias=True, beta=1.0, seed=4) -> onnx.ModelProto:
    u = QdqUnit(seed)
    x, x_scale = u.qdq(u.b.input("x", ["batch", 16]), -2.0, 2.0)
    w = u.b.rng.standard_normal((16, 10)).astype(np.float32) * np.linspace(0.1, 0.4, 10, dtype=np.float32)
    w = w.T.copy() if trans_b else w
    columns_axis = 0 if trans_b else 1
    w_dq, w_scale = u.weight_dq(w, columns_axis if per_column else None)
    inputs = [x, w_dq]
    if bias:
        inputs.append(u.bias_dq(u.b.rng.standard_normal(10).astype(np.float32) * 0.5,
                                np.float32(x_scale) * w_scale * np.ones(10, np.float32)))
    y = u.output(u.b.op("Gemm", *inputs, transB=int(trans_b), beta=beta, name="gemm"), -6.0, 6.0)
    return u.b.build(y, output_names=["y"])


@pytest.mark.parametrize("trans_b", [True, False], ids=["transB", "plain"])
@pytest.mark.parametrize("per_column", [True, False], ids=["per-column", "per-tensor"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_gemm_unit_becomes_qgemm_at_ort_cpu(tmp_path, trans_b, per_column, bias):
    model = gemm_unit(trans_b=trans_b, per_column=per_column, bias=bias)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("qgemm",))
    counts = op_counts(result.model)
    assert counts["com.microsoft::QGemm"] == 1 and "Gemm" not in counts, counts
    close_at_every_setting(model, result.model)


def test_the_standard_target_keeps_the_gemm_unit(tmp_path):
    """No standard operator takes a quantized Gemm with its bias: --target onnx leaves the unit."""
    model = gemm_unit()
    counts = op_counts(optimize_model(model, tmp_path, target="onnx").model)
    assert counts["Gemm"] == 1 and "com.microsoft::QGemm" not in counts


def test_a_gemm_that_scales_its_bias_stays(tmp_path):
    model = gemm_unit(beta=0.5)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("qgemm",))
    assert_declined(model, result, "qgemm", "scales its bias by beta 0.5; QGemm has no beta")
