"""pin-gelu-bias: a GELU's bias as a [1, N] row, so onnxruntime's level-all optimizer makes no CPU BiasGelu."""

from __future__ import annotations

import collections

import onnx
import pytest

from tests.conftest import assert_equivalent, optimize_model, saved_by_onnxruntime
from tests.graphs import assert_declined, signature
from tests.test_pass_contrib_gelu import HIDDEN, activation

SEQUENCE_INPUT = ("batch", "sequence", HIDDEN)


def ort_level_all_ops(model: onnx.ModelProto, tmp_path, name: str) -> collections.Counter:
    """The operators onnxruntime's own optimizer (ORT_ENABLE_ALL, CPU) makes of `model`."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return collections.Counter(n.op_type for n in saved_by_onnxruntime(model, folder, "all").graph.node)


def bias_shapes(model: onnx.ModelProto) -> list[list[int]]:
    initializers = {t.name: list(t.dims) for t in model.graph.initializer}
    return [initializers[i] for n in model.graph.node if n.op_type == "Add" for i in n.input if i in initializers
            and len(initializers[i]) >= 1 and initializers[i][-1] == HIDDEN]


FORMS = {  # activation() arguments, target, passes, whether onnxruntime makes BiasGelu of the original
    "erf": ({"form": "erf"}, "onnx", ("pin-gelu-bias",), True),
    "erf-half-on-x": ({"form": "erf", "half": "on-x"}, "onnx", ("pin-gelu-bias",), True),
    "erf-half-on-gate": ({"form": "erf", "half": "on-gate"}, "onnx", ("pin-gelu-bias",), False),
    "erf-bias-first": ({"form": "erf", "commuted": True}, "onnx", ("pin-gelu-bias",), True),
    "standard-gelu": ({"form": "gelu", "opset": 20}, "onnx", ("pin-gelu-bias",), True),
    "contrib-gelu": ({"form": "erf"}, "ort-cpu", ("contrib-gelu", "pin-gelu-bias"), True),
    "ort-both-providers": ({"form": "erf"}, "ort", ("contrib-gelu", "pin-gelu-bias"), True),
}


@pytest.mark.parametrize("form", FORMS)
def test_bias_becomes_a_row_and_onnxruntime_makes_no_bias_gelu(tmp_path, form):
    kwargs, target, passes, ort_fuses_original = FORMS[form]
    model = activation(x_shape=SEQUENCE_INPUT, bias_shape=(HIDDEN,), **kwargs)
    result = optimize_model(model, tmp_path, target=target, passes=passes)
    assert [f.pass_name for f in result.report.fusions].count("pin-gelu-bias") == 1
    assert bias_shapes(result.model) == [[1, HIDDEN]]
    assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 5})
    # the reason for the pass: onnxruntime fuses the original's Add + Gelu, not fuse's
    assert ort_level_all_ops(model, tmp_path, "original")["BiasGelu"] == int(ort_fuses_original)
    assert ort_level_all_ops(result.model, tmp_path, "fused")["BiasGelu"] == 0


def test_rank_one_input_is_declined(tmp_path):
    """[N] + [1, N] is [1, N]: the sum would gain a rank."""
    model = activation(form="erf", x_shape=(HIDDEN,), bias_shape=(HIDDEN,))
    result = optimize_model(model, tmp_path, target="onnx", passes=("pin-gelu-bias",))
    assert_declined(model, result, "pin-gelu-bias", "input has rank 1: a [1, N] bias would raise the sum to rank 2")


@pytest.mark.parametrize("kwargs", [
    {"form": "tanh"},  # onnxruntime makes FastGelu of it, not BiasGelu
    {"form": "gelu-tanh", "opset": 20},
    {"form": "quick"},  # not a GELU
    {"form": "erf", "bias_input": True},  # a run-time bias
], ids=["tanh", "standard-tanh", "quick", "bias-is-an-input"])
def test_other_activations_and_run_time_biases_stay_silent(tmp_path, kwargs):
    model = activation(x_shape=SEQUENCE_INPUT, bias_shape=(HIDDEN,), **kwargs)
    result = optimize_model(model, tmp_path, target="onnx", passes=("pin-gelu-bias",))
    assert not result.report.fusions
    assert signature(result.model) == signature(model)
    assert not [m for m in result.report.near_misses if m.pass_name == "pin-gelu-bias"]


def test_a_row_bias_is_left_alone(tmp_path):
    model = activation(form="erf", x_shape=SEQUENCE_INPUT, bias_shape=(1, HIDDEN))
    result = optimize_model(model, tmp_path, target="onnx", passes=("pin-gelu-bias",))
    assert not result.report.fusions


def test_not_on_cuda_where_bias_gelu_is_faster(tmp_path):
    model = activation(form="erf", x_shape=SEQUENCE_INPUT, bias_shape=(HIDDEN,))
    result = optimize_model(model, tmp_path, target="ort-cuda", passes=("contrib-gelu", "pin-gelu-bias"))
    assert [f.pass_name for f in result.report.fusions] == ["contrib-gelu"]
    assert bias_shapes(result.model) == [[HIDDEN]]


def test_default_pipeline_keeps_the_row(tmp_path):
    """Every pass of the target's pipeline after it (and the fixpoint's next rounds) leaves the row as it is."""
    model = activation(form="erf", x_shape=SEQUENCE_INPUT, bias_shape=(HIDDEN,))
    for target in ("onnx", "ort-cpu"):
        result = optimize_model(model, tmp_path, target=target, name=target)
        assert bias_shapes(result.model) == [[1, HIDDEN]], target
        assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 5})
        assert ort_level_all_ops(result.model, tmp_path, target)["BiasGelu"] == 0
