"""--target ort leaves no decomposed LayerNorm, GELU or attention in the transformer sample and a
BERT-style model, at opset 14 and 17, and the outputs match (the issue's done-when)."""

import onnx
import pytest

from tests.attention_graphs import attention_model
from tests.conftest import SAMPLES, assert_equivalent, optimize_model
from tests.graphs import op_counts

DECOMPOSED = {"ReduceMean", "Pow", "Sqrt", "Erf", "Tanh", "Softmax"}


@pytest.mark.parametrize("build", [
    lambda: onnx.load(SAMPLES / "transformer_block_opset14.onnx"),
    lambda: onnx.load(SAMPLES / "transformer_block_opset17.onnx"),
    lambda: attention_model(opset=14, mask="padding"),
    lambda: attention_model(opset=17, mask="padding"),
], ids=["sample-opset14", "sample-opset17", "bert-attention-opset14", "bert-attention-opset17"])
def test_no_decomposed_subgraph_is_left(tmp_path, build):
    model = build()
    result = optimize_model(model, tmp_path, target="ort")
    left = DECOMPOSED & set(op_counts(result.model))
    assert not left, f"still decomposed: {left}"
    for dims in ({"batch": 1, "sequence": 7}, {"batch": 3, "sequence": 16}):
        assert_equivalent(model, result.model, dims=dims)
