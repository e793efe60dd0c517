"""standard-cached-attention: attention over K/V the graph holds as heads (Whisper's cross-attention
over the cached encoder K/V) -> the standard Attention (opset 23) on 4-D Q, K, V."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from fuse_cli.verify import verify_models
from tests.conftest import optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

PASS = ("standard-cached-attention",)
HEADS, D = 4, 8
SIZES = ({"batch": 2, "sequence": 3, "encoder": 5}, {"batch": 3, "sequence": 7, "encoder": 11})


def cross_attention(*, kv_heads: int = HEADS, mask: str = "none", opset: int = 23) -> onnx.ModelProto:
    """q = split(x W) [batch, H, sequence, d] * d^-1/2; K, V graph inputs [batch, KV, encoder, d],
    repeat_kv'd to H heads where KV < H; softmax(q K^T (+ mask)) V, merged to [batch, sequence, H*d]."""
    b = GraphBuilder(opset=opset, seed=3)
    hidden = HEADS * D
    x = b.input("x", ["batch", "sequence", hidden])
    key, value = (b.input(name, ["batch", kv_heads, "encoder", D]) for name in ("encoder_key", "encoder_value"))
    q = b.op("Transpose", b.op("Reshape", b.op("MatMul", x, b.const(b.rand(hidden, hidden))),
                               b.const(np.array([0, 0, HEADS, D], np.int64))), perm=[0, 2, 1, 3])
    q = b.op("Mul", q, b.const(np.float32(D**-0.5)))
    if kv_heads != HEADS:
        def repeat_kv(t: str) -> str:
            dims = b.op("Shape", t)
            batch = b.op("Slice", dims, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)))
            rest = b.op("Slice", dims, b.const(np.array([2], np.int64)), b.const(np.array([4], np.int64)))
            expanded = b.op("Expand", b.op("Unsqueeze", t, b.const(np.array([2], np.int64))),
                            b.op("Concat", batch, b.const(np.array([kv_heads, HEADS // kv_heads], np.int64)), rest,
                                 axis=0))
            return b.op("Reshape", expanded, b.op("Concat", batch, b.const(np.array([HEADS], np.int64)), rest, axis=0))
        key, value = repeat_kv(key), repeat_kv(value)
    scores = b.op("MatMul", q, b.op("Transpose", key, perm=[0, 1, 3, 2]))
    if mask != "none":
        scores = b.op("Add", scores, b.input("mask", ["batch", 1, 1 if mask == "per-key" else "sequence", "encoder"]))
    context = b.op("MatMul", b.op("Softmax", scores, axis=-1), value)
    merged = b.op("Reshape", b.op("Transpose", context, perm=[0, 2, 1, 3]), b.const(np.array([0, 0, hidden], np.int64)))
    return b.build(b.op("MatMul", merged, b.const(b.rand(hidden, hidden))), output_names=["y"])


def assert_same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    for dims in SIZES:
        result = verify_models(original, fused, dims=dims, seed=0, rtol=1e-4, atol=1e-5)
        assert result.passed, result.outputs


@pytest.mark.parametrize("kv_heads, mask", [(HEADS, "none"), (2, "none"), (HEADS, "per-query")])
def test_cross_attention_fuses_into_the_standard_attention_on_4d_inputs(kv_heads, mask, tmp_path):
    model = cross_attention(kv_heads=kv_heads, mask=mask)
    result = optimize_model(model, tmp_path, passes=PASS)
    counts = op_counts(result.model)
    assert counts["Attention"] == 1 and "Softmax" not in counts and "Expand" not in counts, counts
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert list(node.input)[1:3] == ["encoder_key", "encoder_value"]  # repeat_kv'd K/V read unrepeated
    assert not any(n.domain for n in result.model.graph.node)
    assert_same_outputs(model, result.model)


def test_a_mask_broadcast_over_the_queries_declines(tmp_path):
    model = cross_attention(mask="per-key")  # [batch, 1, 1, encoder]: onnxruntime's Attention does not broadcast it
    result = optimize_model(model, tmp_path, passes=PASS)
    assert_declined(model, result, "standard-cached-attention",
                    "is not provably [batch or 1, 1 or 4, sequence, key length]")


def test_before_opset_23_it_waits(tmp_path):
    model = cross_attention(opset=17)
    result = optimize_model(model, tmp_path, passes=PASS)
    assert "Attention" not in op_counts(result.model)
    upgraded = optimize_model(model, tmp_path, name="upgraded", upgrade_opset=23)
    assert op_counts(upgraded.model)["Attention"] == 1
    assert_same_outputs(model, upgraded.model)
