"""A near-miss is a match whose anchor structure fit and whose precondition failed. "These nodes
are not the pattern" (two Unsqueezes, a residual Add taken for a bias, a LayerNorm taken for an
RMSNorm, a pooled input taken for a Conv) is silent: on a BERT export such lines used to bury the
few near-misses worth reading. Checked over the corpus-like graphs the tests build, at both the
portable and the onnxruntime pipelines."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests import attention_graphs
from tests.conftest import SAMPLES, optimize_model
from tests.graphs import GraphBuilder
from tests.test_pass_rms_norm import decomposed_rms_norm

import onnx

# Reasons that say the matched nodes are some other construct, not the pattern with a failed precondition.
NOT_THE_PATTERN = re.compile(r"not a Squeeze/Unsqueeze pair|is computed at run time by|not a Conv/ConvTranspose"
                             r"|: a LayerNorm \(see|are both (Squeeze|Unsqueeze)")


def densenet_block() -> onnx.ModelProto:
    """DenseNet: BN + ReLU + Conv over the Concat of a pooled map and Conv outputs."""
    b = GraphBuilder()
    x = b.input("x", ["batch", 4, 8, 8])
    pooled = b.op("AveragePool", x, kernel_shape=[1, 1])
    grown = b.op("Conv", pooled, b.const(b.rand(2, 4, 1, 1)))
    concat = b.op("Concat", pooled, grown, axis=1)
    bn = b.op("BatchNormalization", concat, *(b.const(b.rand(6, low=0.5, high=1.5)) for _ in range(4)))
    return b.build(b.op("Conv", b.op("Relu", bn), b.const(b.rand(3, 6, 1, 1))), output_names=["y"])


def bert_mask() -> onnx.ModelProto:
    """BERT's extended attention mask: Unsqueeze(1) then Unsqueeze(2), (1 - m) * min, added to scores."""
    b = GraphBuilder(opset=14)
    mask = b.input("mask", ["batch", "sequence"])
    scores = b.input("scores", ["batch", 2, "sequence", "sequence"])
    m4 = b.op("Unsqueeze", b.op("Unsqueeze", mask, b.const(np.array([1], np.int64))), b.const(np.array([2], np.int64)))
    bias = b.op("Mul", b.op("Sub", b.const(np.float32(1.0)), m4), b.const(np.float32(-1e4)))
    return b.build(b.op("Softmax", b.op("Add", scores, bias), axis=-1), output_names=["y"])


MODELS = {
    **{name: (lambda name=name: onnx.load(SAMPLES / name)) for name in
       ("transformer_block_opset14.onnx", "transformer_block_opset17.onnx", "cnn_bn_relu.onnx", "mlp.onnx")},
    "bert-opset14": lambda: attention_graphs.bert(14, True),
    "gpt2-opset14": lambda: attention_graphs.gpt2(14, True),
    "vit-opset17": lambda: attention_graphs.vit(17),
    "dynamo-sdpa": attention_graphs.dynamo_sdpa_model,
    "layer-norm-as-rms": lambda: decomposed_rms_norm(centered=True),
    "densenet-block": densenet_block,
    "bert-mask": bert_mask,
}


@pytest.mark.parametrize("target", ["onnx", "ort"])
@pytest.mark.parametrize("name", MODELS)
def test_no_near_miss_says_not_the_pattern(tmp_path, name, target):
    result = optimize_model(MODELS[name](), tmp_path, target=target)
    wrong = [f"{m.pass_name}: {m.reason}" for m in result.report.near_misses if NOT_THE_PATTERN.search(m.reason)]
    assert not wrong
