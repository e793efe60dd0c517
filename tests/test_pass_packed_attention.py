"""packed-attention: self-attention's Q/K/V MatMuls + MultiHeadAttention -> the packed-QKV com.microsoft Attention."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto

from fuse_cli.verify import verify_models
from tests.attention_graphs import assert_same_outputs, attention_model, bert
from tests.conftest import SAMPLES, optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts

ATTENTION, MHA = "com.microsoft::Attention", "com.microsoft::MultiHeadAttention"
PASSES = ("attention", "packed-attention")


FORMS = {
    "bert-opset14-padding": bert(14, padding=True),
    "bert-opset17": bert(17, padding=False),
    "custom-scale": attention_model(scale="custom", mask="padding"),
    "scale-on-q-and-k": attention_model(scale="both", k_transpose="pair"),
}


@pytest.mark.parametrize("form", FORMS)
def test_self_attention_packs_its_projections(form, tmp_path):
    model = FORMS[form]
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    counts = op_counts(result.model)
    assert counts[ATTENTION] == 1 and MHA not in counts and counts["MatMul"] == 1  # the output projection stays
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    weights = {i.name: i for i in result.model.graph.initializer}[node.input[1]]
    assert list(weights.dims) == [64, 192]
    assert_same_outputs(model, result.model)


def test_dynamo_bert_form_packs(tmp_path):
    """torch's dynamo export (the head split [-1, S, H, d] with S written out, K^T through a
    batch-flattened view) reaches packed-attention as the same MatMuls + MultiHeadAttention."""
    from tests.attention_graphs import dynamo_sdpa_model

    model = dynamo_sdpa_model()
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert op_counts(result.model)[ATTENTION] == 1
    for seed in (0, 1):
        assert verify_models(model, result.model, dims={}, seed=seed, rtol=1e-4, atol=1e-5).passed


def test_sample_transformer_block_packs_in_the_runtime_pipeline(tmp_path):
    model = onnx.load(SAMPLES / "transformer_block_opset17.onnx")
    result = optimize_model(model, tmp_path, target="ort-cpu")
    counts = op_counts(result.model)
    assert counts[ATTENTION] == 1 and MHA not in counts
    assert_same_outputs(model, result.model)


def test_value_wider_than_query_sets_qkv_hidden_sizes(tmp_path):
    model = mha_over_projections(widths=(32, 32, 48))
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("packed-attention",))
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert [list(a.ints) for a in node.attribute if a.name == "qkv_hidden_sizes"] == [[32, 32, 48]]
    assert_same_outputs(model, result.model)


def mha_over_projections(*, widths=(32, 32, 32), heads: int = 2, cross: bool = False, weight_input: bool = False,
                         key_padding_mask: bool = False) -> onnx.ModelProto:
    """MultiHeadAttention(x·Wq, kv·Wk, kv·Wv, bias, key_padding_mask?, attention_bias [B, 1, S, T])."""
    b = GraphBuilder(opset=17, seed=3, extra_opsets={"com.microsoft": 1})
    x = b.input("hidden", ["batch", "sequence", 24])
    kv = b.input("memory", ["batch", "sequence", 24]) if cross else x
    weights = [b.const(b.rand(24, w) * 0.2) for w in widths]
    if weight_input:
        weights[1] = b.input("key_weight", [24, widths[1]])
    projections = [b.op("MatMul", t, w) for t, w in zip((x, kv, kv), weights)]
    mask = b.input("attention_bias", ["batch", 1, "sequence", "sequence"])
    padding = [b.input("attention_mask", ["batch", "sequence"], TensorProto.INT32)] if key_padding_mask else [""]
    out = b.op("MultiHeadAttention", *projections, b.const(b.rand(sum(widths)) * 0.1), *padding, mask,
               domain="com.microsoft", num_heads=heads, name="mha")
    model = b.build(out, output_names=("output",))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    return model


@pytest.mark.parametrize("model, reason", [
    (mha_over_projections(cross=True), "are not projections of its query's input 'hidden' (cross-attention)"),
    (mha_over_projections(weight_input=True), "is a graph input, not a constant"),
    (mha_over_projections(widths=(32, 48, 32)), "the query and key projections differ in width (32 and 48)"),
    (mha_over_projections(key_padding_mask=True), "has a key_padding_mask"),
], ids=["cross-attention", "weight-not-constant", "query-key-widths-differ", "key-padding-mask"])
def test_near_misses_leave_the_graph_and_say_why(model, reason, tmp_path):
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("packed-attention",))
    assert_declined(model, result, "packed-attention", reason)


def test_cross_attention_from_the_export_keeps_multihead_attention(tmp_path):
    model = attention_model(cross=True, mask="padding")
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert op_counts(result.model)[MHA] == 1 and ATTENTION not in op_counts(result.model)
    assert any("cross-attention" in m.reason for m in result.report.near_misses if m.pass_name == "packed-attention")


def test_cuda_targets_decline_it_unmeasured(tmp_path):
    model = bert(17, padding=True)
    result = optimize_model(model, tmp_path, target="ort", passes=PASSES)
    assert op_counts(result.model)[MHA] == 1
    assert any("CPU provider only" in m.reason for m in result.report.near_misses if m.pass_name == "packed-attention")

