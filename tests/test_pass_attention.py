"""attention: BERT / GPT-2 / ViT self-attention (and cross-attention) -> com.microsoft MultiHeadAttention."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from fuse_cli.errors import UsageError
from fuse_cli.passes import pipeline_for, resolve
from tests.attention_graphs import assert_same_outputs, attention_model, bert, dynamo_sdpa_model, gpt2, vit, vit_static
from tests.conftest import assert_equivalent, SAMPLES, optimize_model
from tests.graphs import op_counts

MHA = "com.microsoft::MultiHeadAttention"
UNPACKED = ("packed-attention",)  # the runtime pipeline as far as this pass: packed-attention would take its output


def mha_attrs(model: onnx.ModelProto) -> dict:
    (node,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def merged_by(model: onnx.ModelProto, shape: list[int]) -> onnx.ModelProto:
    """`model` with its heads merged by a Reshape to `shape` (onnxruntime's quant_pre_process
    writes [0, 0, -1] for torch's [0, 0, H*d])."""
    (merge,) = [n for n in model.graph.node if n.name == "merge_reshape"]
    (target,) = [t for t in model.graph.initializer if t.name == merge.input[1]]
    target.CopyFrom(onnx.numpy_helper.from_array(np.array(shape, np.int64), target.name))
    return model


FORMS = {
    "bert-opset14-padding": (bert(14, padding=True), 4, None),
    "bert-opset14": (bert(14, padding=False), 4, None),
    "bert-opset17-padding": (bert(17, padding=True), 4, None),
    "bert-opset17": (bert(17, padding=False), 4, None),
    "gpt2-opset14-padding": (gpt2(14, padding=True), 4, None),
    "gpt2-opset17": (gpt2(17, padding=False), 4, None),
    "vit-opset14": (vit(14), 6, None),
    "vit-opset17": (vit(17), 6, None),
    "vit-static-length-opset14": (vit_static(14), 6, None),
    "vit-static-length-opset17": (vit_static(17), 6, None),
    "fused-matmul-scores": (vit_static(17, fused_scores=True), 6, None),
    "fused-matmul-scores-trans-b": (attention_model(fused_scores=True, k_transpose="pair", mask="padding"), 4, None),
    "scale-mul": (attention_model(scale="mul", mask="padding"), 4, None),
    "scale-on-q-and-k": (attention_model(scale="both", k_transpose="pair"), 4, None),
    "custom-scale": (attention_model(scale="custom"), 4, 0.2),
    "cross-attention": (attention_model(cross=True, mask="padding"), 4, None),
    "masked-fill-inf": (attention_model(causal_fill=-np.inf, masked_fill=True, mask="padding"), 4, None),
    "merge-to-minus-one": (merged_by(bert(17, padding=True), [0, 0, -1]), 4, None),
}


@pytest.mark.parametrize("form", FORMS)
def test_attention_forms_fuse_into_multihead_attention(form, tmp_path):
    model, heads, scale = FORMS[form]
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("attention",))
    counts = op_counts(result.model)
    assert counts[MHA] == 1 and counts["MatMul"] in (2, 4)  # the (Q, K, V or packed) and output projections stay
    assert not {"Softmax", "Transpose", "Reshape"} & set(counts), counts
    attrs = mha_attrs(result.model)
    assert attrs["num_heads"] == heads
    assert attrs.get("scale") == (pytest.approx(scale) if scale else None)  # 1/sqrt(head_size) is the default
    assert_same_outputs(model, result.model)
    again = optimize_model(result.model, tmp_path, name="again", target="ort-cpu", passes=("attention",))
    assert not again.report.fusions and not again.report.near_misses


def test_projection_biases_become_the_bias_input(tmp_path):
    model = bert(17, padding=False)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("attention",))
    (node,) = [n for n in result.model.graph.node if n.op_type == "MultiHeadAttention"]
    assert [i.split("_")[0] for i in node.input[:3]] == ["query", "key", "value"]  # the MatMul outputs
    bias = next(t for t in result.model.graph.initializer if t.name == node.input[3])
    assert list(bias.dims) == [3 * 64]
    assert op_counts(result.model)["Add"] == 0


@pytest.mark.parametrize("opset", [14, 17])
def test_sample_transformer_block_fuses_in_the_runtime_pipeline(opset, tmp_path):
    model = onnx.load(SAMPLES / f"transformer_block_opset{opset}.onnx")
    result = optimize_model(model, tmp_path, target="ort-cpu")
    # attention's MultiHeadAttention over three projections of one input, then packed-attention's Attention
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    assert MHA not in op_counts(result.model)
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"num_heads": 4}
    assert_same_outputs(model, result.model)


def shape_from_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """The query's split shape given as a graph input: no inference knows the heads then."""
    (reshape,) = [n for n in model.graph.node if n.name == "query_reshape"]
    reshape.input[1] = "query_split_shape"
    model.graph.input.append(onnx.helper.make_tensor_value_info("query_split_shape", onnx.TensorProto.INT64, [4]))
    return model


NEAR_MISSES = {
    "mask-rank-3": (attention_model(mask="rank3"), "ort-cpu",
                    "the mask 'mask_mul_out' has shape ['batch', 1, 'sequence']; attention_bias needs rank 4"),
    "scale-not-constant": (attention_model(scale="computed"), "ort-cpu",
                           "scale_div's score_scale 'Sqrt_1_out' is computed at run time by Sqrt_1"),
    "heads-not-derivable": (shape_from_input(attention_model(split_shape="concat")), "ort-cpu",
                            "the head count is not derivable: query_reshape's shape is computed at run time"),
    "length-not-the-static-one": (attention_model(static_length=17), "ort-cpu",
                                  "query_reshape reshapes to [0, 17, 4, 16]: sequence length 17 is not "
                                  "'query_matmul_out''s static dim 1 (sequence)"),
    "probabilities-are-an-output": (attention_model(probs_output=True), "ort-cpu",
                                    "softmax's output 'probs' is a graph output"),
    "causal-fill-too-small": (attention_model(causal_fill=-10000.0), "ort-cpu",
                              "causal_where fills masked scores with [-10000.0]: attention_bias adds"),
    "softmax-over-queries": (attention_model(softmax_axis=2), "ort-cpu",
                             "softmax normalizes axis 2, not the key axis 3"),
    "opset-7": (attention_model(opset=7, softmax_axis=3), "ort-cpu",
                "needs opset 8, the model has opset 7: pass --upgrade-opset 8"),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_misses_leave_the_graph_and_say_why(case, tmp_path):
    model, target, reason = NEAR_MISSES[case]
    result = optimize_model(model, tmp_path, target=target, passes=("attention",))
    assert op_counts(result.model) == op_counts(model)
    reasons = [m.reason for m in result.report.near_misses if m.pass_name == "attention"]
    assert any(reason in r for r in reasons), reasons


@pytest.mark.parametrize("target", ["ort-cuda", "ort-cpu"])
def test_float16_fuses(tmp_path, target):
    """On the CPU provider the float16 MatMuls, Softmax and Adds ran in float32 between Casts it
    inserts, as the float32-only MultiHeadAttention then does (verified against the original)."""
    model = attention_model(dtype=np.float16)
    result = optimize_model(model, tmp_path, target=target, passes=("attention",))
    assert op_counts(result.model)[MHA] == 1
    assert_equivalent(model, result.model)


def test_target_onnx_never_runs_the_pass():
    assert "attention" not in pipeline_for("onnx") and "attention" in pipeline_for("ort-cpu")
    with pytest.raises(UsageError, match="cannot run"):
        resolve("onnx", ["attention"])


@pytest.mark.parametrize("symbolic", [False, True], ids=["static-length", "symbolic-length"])
def test_dynamo_sdpa_form_fuses(tmp_path, symbolic):
    model = dynamo_sdpa_model(symbolic=symbolic)
    result = optimize_model(model, tmp_path, target="ort-cpu", disable=UNPACKED)
    assert op_counts(result.model)[MHA] == 1
    assert not {"IsNaN", "Softmax"} & set(op_counts(result.model))  # the mask's Where stays: it is the bias
    assert mha_attrs(result.model)["num_heads"] == 2
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("variant", [{"flat_shape": [-1, 4, 5]}, {"guard_other": True}])
def test_dynamo_sdpa_near_forms_do_not_fuse(tmp_path, variant):
    """Reshape [-1, d, S] has K^T's sizes but reinterprets memory; a NaN guard on the scores is
    not the softmax's (the fused kernel would drop it)."""
    model = dynamo_sdpa_model(**variant)
    result = optimize_model(model, tmp_path, target="ort-cpu", disable=UNPACKED)
    assert op_counts(result.model)[MHA] == 0
    assert_same_outputs(model, result.model)


def test_dynamo_key_transpose_is_also_proved_from_the_shape_vectors(tmp_path, monkeypatch):
    """BERT's export: shape inference may not know the flattened K's dims, then K^T is proved by
    the Shape(K) dims its shape vectors read ([-1, T, d] and [B, H, d, T])."""
    import fuse_cli.toolkit.heads as heads

    monkeypatch.setattr(heads, "_flattened_by_inferred_shapes", lambda m, g, k: False)
    model = dynamo_sdpa_model(symbolic=True)
    result = optimize_model(model, tmp_path, target="ort-cpu", disable=UNPACKED)
    assert op_counts(result.model)[MHA] == 1
    assert_same_outputs(model, result.model)
