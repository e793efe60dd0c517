"""eliminate-identity / eliminate-dropout: no-op nodes removed, graph output names preserved."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

# Pinned, so passes added to the default pipeline cannot change what these tests exercise.
PASSES = ("eliminate-identity", "eliminate-dropout")


def output_names(model) -> list[str]:
    return [o.name for o in model.graph.output]


def identity_chain(b: GraphBuilder, x: str) -> list[str]:
    return [b.op("Relu", b.op("Identity", b.op("Neg", x)))]


def identity_to_output(b: GraphBuilder, x: str) -> list[str]:
    r = b.op("Neg", x)
    return [b.op("Identity", r), b.op("Relu", r)]  # r is read by the Identity and by Relu


def dropout(outputs: int = 1, attrs=None, **inputs):
    """Neg -> Dropout -> Relu; ratio/training_mode given as constants (None: input left out)."""
    def build(b: GraphBuilder, x: str) -> list[str]:
        args = [b.const(v, dtype=np.bool_ if k == "training_mode" else np.float32) if v is not None else ""
                for k, v in inputs.items()]
        while args and not args[-1]:
            args.pop()
        out = b.op("Dropout", b.op("Neg", x), *args, outputs=outputs, **(attrs or {}))
        return [b.op("Relu", out[0] if outputs > 1 else out)]
    return build


def model_of(build, opset: int = 13):
    b = GraphBuilder(opset=opset)
    outputs = build(b, b.input("x", [2, 3]))
    return b.build(*outputs, output_names=[f"y{i}" for i in range(len(outputs))])


@pytest.mark.parametrize("build, opset", [
    pytest.param(identity_chain, 13, id="identity-chain"),
    pytest.param(identity_to_output, 13, id="identity-to-graph-output"),
    pytest.param(dropout(), 13, id="dropout"),
    pytest.param(dropout(ratio=0.5), 13, id="dropout-ratio"),
    pytest.param(dropout(ratio=0.5, training_mode=False), 13, id="dropout-training-false"),
    pytest.param(dropout(ratio=None, training_mode=False), 13, id="dropout-training-false-no-ratio"),
    pytest.param(dropout(outputs=2), 13, id="dropout-mask-unused"),
    pytest.param(dropout(attrs={"ratio": 0.3}), 10, id="dropout-opset10"),
])
def test_removed(tmp_path, build, opset):
    model = model_of(build, opset)
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Neg": 1, "Relu": 1}
    assert output_names(result.model) == output_names(model)
    assert_equivalent(model, result.model)
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


def _input_to_output(b, x):
    return [b.op("Identity", x)]


def _both_outputs(b, x):
    r = b.op("Neg", x)
    return [r, b.op("Identity", r)]


def _mask_used(b, x):
    out, mask = b.op("Dropout", b.op("Neg", x), outputs=2, name="drop")
    return [out, b.op("Not", mask)]


def _training_input(b, x):
    return [b.op("Dropout", x, b.const(0.5), b.input("train", [], dtype=TensorProto.BOOL), name="drop")]


@pytest.mark.parametrize("build, pass_name, reason", [
    pytest.param(_input_to_output, "eliminate-identity",
                 "'y0' is a graph output fed directly by 'x', which is a graph input", id="identity-input-to-output"),
    pytest.param(_both_outputs, "eliminate-identity", "both 'y1' and 'y0' are graph outputs",
                 id="identity-between-outputs"),
    pytest.param(dropout(ratio=0.5, training_mode=True), "eliminate-dropout",
                 "is in training mode (training_mode=true)", id="dropout-training-true"),
    pytest.param(_mask_used, "eliminate-dropout", "drop's mask output 'drop_out1' is used", id="dropout-mask-used"),
    pytest.param(_training_input, "eliminate-dropout", "drop's training_mode is not a constant",
                 id="dropout-training-input"),
])
def test_kept(tmp_path, build, pass_name, reason):
    model = model_of(build)
    assert_declined(model, optimize_model(model, tmp_path, passes=PASSES), pass_name, reason)
