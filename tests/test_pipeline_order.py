"""Pass order is part of the design: each dependency below is stated in the pipelines and shown
to matter on a graph where the other order would give a worse (still correct) model."""

import numpy as np
import pytest

from fuse_cli.passes import PIPELINES
from tests.attention_graphs import attention_model
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

# (earlier, later, why)
DEPENDENCIES = [
    ("fold-constants", "conv-bn", "weights built by ConstantOfShape must be constants before folding"),
    ("conv-bn", "bn-conv", "a BN after a Conv folds exactly at any padding; before one only when unpadded"),
    ("conv-bn", "fused-conv", "FusedConv takes the Conv with BN already in its weights"),
    ("static-reshape-shape", "attention", "attention reads the head count from a constant Reshape shape"),
    ("layer-norm", "skip-layer-norm", "SkipLayerNormalization absorbs the LayerNormalization layer-norm makes"),
    ("attention", "packed-attention",
     "packed-attention packs the projections of the MultiHeadAttention attention makes"),
    ("attention", "matmul-add", "Gemm would hide the Q/K/V MatMul + Add of the attention pattern"),
    ("bias-gelu", "matmul-add", "Gemm would take the bias Add that BiasGelu absorbs"),
    ("attention", "fused-matmul", "FusedMatMul would take the scaled Q.K^T out of the attention pattern"),
    ("matmul-add", "fused-gemm", "FusedGemm fuses the Gemm that matmul-add makes"),
    ("dynamic-quantize-matmul", "attention",
     "a projection's bias belongs in the quantized kernel's epilogue, not in MultiHeadAttention's extra pass"),
]


@pytest.mark.parametrize("earlier, later, why", DEPENDENCIES, ids=[f"{a}<{b}" for a, b, _ in DEPENDENCIES])
def test_runtime_pipeline_order(earlier, later, why):
    pipeline = PIPELINES["ort-cuda"]
    assert pipeline.index(earlier) < pipeline.index(later), why
    portable = PIPELINES["onnx"]
    if earlier in portable and later in portable:
        assert portable.index(earlier) < portable.index(later), why


def test_conv_bn_relu_becomes_one_fused_conv(tmp_path):
    b = GraphBuilder()
    x = b.input("x", ["batch", 3, 8, 8])
    c = b.op("Conv", x, b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)), b.const(b.rand(4)),
             b.const(b.rand(4, low=0.5, high=2.0)))
    model = b.build(b.op("Relu", y), output_names=["y"])
    result = optimize_model(model, tmp_path, target="ort-cpu")
    assert op_counts(result.model) == {"com.microsoft::FusedConv": 1}
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_residual_layer_norm_becomes_skip_layer_norm_from_the_decomposed_form(tmp_path):
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 8, 16])
    r = b.input("r", ["batch", 8, 16])
    s = b.op("Add", x, r)
    mean = b.op("ReduceMean", s, axes=[-1])
    d = b.op("Sub", s, mean)
    var = b.op("ReduceMean", b.op("Pow", d, b.const(np.float32(2.0))), axes=[-1])
    norm = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const(np.float32(1e-5)))))
    y = b.op("Add", b.op("Mul", norm, b.const(b.rand(16, low=0.5, high=1.5))), b.const(b.rand(16)))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, target="ort-cuda")  # the skip ops are CUDA-only (slow on CPU)
    assert op_counts(result.model) == {"com.microsoft::SkipLayerNormalization": 1}
    assert_equivalent(model, result.model, dims={"batch": 2})


@pytest.mark.parametrize("opset", [14, 17])
def test_attention_is_fused_before_its_projections_become_gemm(opset, tmp_path):
    model = attention_model(opset=opset, mask="padding")
    result = optimize_model(model, tmp_path, target="ort-cpu")
    counts = op_counts(result.model)
    # attention's MultiHeadAttention, then packed-attention's Attention over its three projections
    assert counts["com.microsoft::Attention"] == 1 and "Softmax" not in counts
    assert_equivalent(model, result.model, dims={"batch": 2, "sequence": 5}, rtol=1e-4, atol=1e-5)
