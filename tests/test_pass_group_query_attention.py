"""group-query-attention: Llama/Qwen2 prefill attention (repeat_kv'd K/V) -> com.microsoft GroupQueryAttention."""

from __future__ import annotations

import onnx
import pytest

from fuse_cli.analysis.memory import planner_shapes
from fuse_cli import targets
from tests.conftest import assert_float16_outputs_match, optimize_model
from tests.graphs import assert_declined, op_counts
from tests.llama_graphs import llama_attention_model
from tests.test_pass_rotary_embedding import assert_same_outputs

GQA = "com.microsoft::GroupQueryAttention"
PASSES = ("rotary-embedding", "group-query-attention")


def gqa_attrs(model: onnx.ModelProto) -> dict:
    (node,) = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


FORMS = {
    "causal-padding-mask": (dict(), 4, 2),
    "no-mask": (dict(mask="none"), 4, 2),
    "three-groups": (dict(heads=6, kv_heads=2), 6, 2),
    "custom-scale": (dict(scale="div"), 4, 2),
    "no-repeat": (dict(kv_heads=4, repeat="none"), 4, 4),
    "dynamo-sdpa": (dict(dynamo=True), 4, 2),
    # position_ids given (transformers 5.x): rotary-embedding's rows per (batch, position) first
    "position-ids-given": (dict(positions="input"), 4, 2),
    # dynamo's GPT-2: the heads merged straight into rows [-1, H*d] for the Gemm after them
    "merged-into-rows": (dict(merge="rows"), 4, 2),
    "dynamo-sdpa-merged-into-rows": (dict(dynamo=True, merge="rows"), 4, 2),
}


@pytest.mark.parametrize("form", FORMS)
def test_llama_attention_fuses_into_group_query_attention(form, tmp_path):
    kwargs, heads, kv_heads = FORMS[form]
    model = llama_attention_model(**kwargs)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    counts = op_counts(result.model)
    # seqlens_k
    assert counts[GQA] == 1 and counts["Expand"] == 1 and not {"Softmax", "Transpose"} & set(counts), counts
    attrs = gqa_attrs(result.model)
    assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["causal"]) == (heads, kv_heads, 0)
    assert attrs.get("scale") == (pytest.approx(1 / 3) if kwargs.get("scale") == "div" else None)
    assert_same_outputs(model, result.model)


FLOAT16_FORMS = {"torchscript": dict(), "dynamo-sdpa": dict(dynamo=True),
                 "dynamo-sdpa-merged-into-rows": dict(dynamo=True, merge="rows")}


@pytest.mark.parametrize("form", FLOAT16_FORMS)
def test_float16_prefill_fuses_into_group_query_attention(form, tmp_path):
    """The kernel runs float16 on the CPU: a model.half() prefill fuses as its float32 copy does
    (fuse-casts first, as the pipeline runs it, takes the TorchScript softmax's exact Cast pair)."""
    model = llama_attention_model(dtype="float16", **FLOAT16_FORMS[form])
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("fuse-casts", *PASSES))
    counts = op_counts(result.model)
    assert counts[GQA] == 1 and counts["com.microsoft::RotaryEmbedding"] == 2 and "Softmax" not in counts, counts
    assert_float16_outputs_match(model, result.model, sizes=({"batch": 3, "sequence": 5}, {"batch": 5, "sequence": 7}))


def test_the_full_runtime_pipeline_fuses_it(tmp_path):
    model = llama_attention_model()
    result = optimize_model(model, tmp_path, target="ort-cpu")
    counts = op_counts(result.model)
    assert counts[GQA] == 1 and counts["com.microsoft::RotaryEmbedding"] == 2, counts
    assert_same_outputs(model, result.model)


DECLINES = {
    "tiled-not-repeated": (dict(repeat="tile"), "is not provably repeat_kv"),
    "head-size-not-a-multiple-of-8": (dict(head_size=4), "not a multiple of 8"),
    "rank-2-mask": (dict(mask="causal-2d"), "is not provably [batch or 1, 1 or 4, sequence, sequence]"),
    "dynamo-flattened-to-d-first": (dict(dynamo=True, flat_shape="d-first", seq=8),
                                    "are not provably K^T through a batch-flattened view"),
}


@pytest.mark.parametrize("case", DECLINES)
def test_near_forms_decline_with_the_reason(case, tmp_path):
    kwargs, reason = DECLINES[case]
    rotated = optimize_model(llama_attention_model(**kwargs), tmp_path, name="rotated", target="ort-cpu",
                             passes=("rotary-embedding",)).model
    result = optimize_model(rotated, tmp_path, target="ort-cpu", passes=("group-query-attention",))
    assert_declined(rotated, result, "group-query-attention", reason)
    assert_same_outputs(rotated, result.model)


def test_targets_with_cuda_decline(tmp_path):
    rotated = optimize_model(llama_attention_model(), tmp_path, name="rotated", target="ort",
                             passes=("rotary-embedding",)).model
    result = optimize_model(rotated, tmp_path, target="ort", passes=("group-query-attention",))
    assert GQA not in op_counts(result.model)
    assert any("CPU provider only" in m.reason or "no float32 kernel" in m.reason
               for m in result.report.near_misses if m.pass_name == "group-query-attention")


@pytest.mark.parametrize("form", [dict(), dict(dynamo=True), dict(cache="present"), dict(positions="input")],
                         ids=["torchscript", "dynamo", "present", "position-ids-given"])
def test_phi3_partial_rotary_over_the_whole_head_fuses(form, tmp_path):
    """Concat(rotary(x[..., :d]), x[..., d:]): the empty pass-through goes, the rotary moves onto the projection."""
    model = llama_attention_model(partial=True, **form)
    result = optimize_model(model, tmp_path, target="ort-cpu")
    counts = op_counts(result.model)
    # cos/sin
    assert counts[GQA] == 1 and counts["com.microsoft::RotaryEmbedding"] == 2 and counts["Concat"] == 1, counts
    assert_same_outputs(model, result.model)


def test_heads_read_outside_the_attention_are_its_present_outputs(tmp_path):
    """K's heads read by another node (Gemma2's sliding-window layers slice their present to the
    window): the kernel returns them as present_key, with present_value beside it (it takes both
    or neither); the peak guard judges what that costs."""
    model = llama_attention_model()
    graph = model.graph
    expand = next(n for n in graph.node if n.op_type == "Expand")
    unsqueeze = next(n for n in graph.node if n.output[0] == expand.input[0])
    k_heads = unsqueeze.input[0]
    graph.node.append(onnx.helper.make_node("ReduceMax", [k_heads], ["k_heads_max"], keepdims=0))
    graph.output.append(onnx.helper.make_tensor_value_info("k_heads_max", onnx.TensorProto.FLOAT, []))
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    (node,) = [n for n in result.model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(node.output) == 3 and node.output[1] == k_heads, list(node.output)
    assert "Softmax" not in op_counts(result.model)
    assert_same_outputs(model, result.model)


# a cap small enough that tanh bends the scores (|s| ~ 1): a kernel that dropped it would not match
SOFTCAP = 0.7


def without_softcap_slowdowns(monkeypatch) -> None:
    """The soft-capped kernels as if onnxruntime's CPU ran them fast: the form fuse would emit."""
    monkeypatch.setattr(targets, "SLOWER", tuple(s for s in targets.SLOWER if not s.op.endswith(":softcap")))


@pytest.mark.parametrize("form", [dict(), dict(dynamo=True), dict(mask="none")],
                         ids=["torchscript", "dynamo", "no-mask"])
def test_soft_capped_scores_are_the_kernels_softcap(form, tmp_path, monkeypatch):
    """Gemma2: tanh(s / c) * c on the scaled scores, before the mask: GroupQueryAttention's softcap
    (where a target takes it; onnxruntime's CPU kernel is measured slower, next test)."""
    without_softcap_slowdowns(monkeypatch)
    model = llama_attention_model(softcap=(SOFTCAP, SOFTCAP), **form)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert "Tanh" not in op_counts(result.model)
    assert gqa_attrs(result.model)["softcap"] == pytest.approx(SOFTCAP)
    assert_same_outputs(model, result.model)


def test_soft_capped_scores_stay_where_the_kernel_is_slower(tmp_path):
    rotated = optimize_model(llama_attention_model(softcap=(SOFTCAP, SOFTCAP)), tmp_path, name="rotated",
                             target="ort-cpu", passes=("rotary-embedding",)).model
    result = optimize_model(rotated, tmp_path, target="ort-cpu", passes=("group-query-attention",))
    assert_declined(rotated, result, "group-query-attention", "GroupQueryAttention with a soft cap measured 1.5-2.0x")


def test_a_cap_that_is_not_one_constant_declines(tmp_path):
    model = llama_attention_model(softcap=(SOFTCAP, 2 * SOFTCAP))
    rotated = optimize_model(model, tmp_path, name="rotated", target="ort-cpu", passes=("rotary-embedding",)).model
    result = optimize_model(rotated, tmp_path, target="ort-cpu", passes=("group-query-attention",))
    assert_declined(rotated, result, "group-query-attention", "not a soft cap tanh(s / c) * c with one positive c")
    assert_same_outputs(rotated, result.model)


def unnamed_behind_the_attention(model: onnx.ModelProto) -> list[bool]:
    """Per fused attention node: is its output read only as Reshape(y, Shape(y)), whose dims
    onnxruntime's planner cannot name (toolkit.runtime_shapes)?"""
    shape_of = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Shape"}
    readers = [n for n in model.graph.node if n.op_type == "Reshape"]
    return [any(r.input[0] == a.output[0] and shape_of.get(r.input[1]) == a.output[0] for r in readers)
            for a in model.graph.node if a.op_type in ("GroupQueryAttention", "MultiHeadAttention")]


def merged_heads(model: onnx.ModelProto) -> str:
    """The attention's output as the graph writes it: what the output projection reads."""
    (projection,) = [n for n in model.graph.node if n.output[0] == "y"]
    return projection.input[0]


def test_a_runtime_shaped_mask_keeps_the_output_unnamed_to_the_planner(tmp_path):
    # The mask is Expand(..., Concat(Shape(...))): onnxruntime names none of the scores' dims, so
    # the merged heads are [?, ?, hidden] to its planner; the fused output is kept so (a view).
    model = llama_attention_model()
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert unnamed_behind_the_attention(result.model) == [True]
    shapes = planner_shapes(result.model)
    assert shapes[merged_heads(result.model)].shape[:2] == (None, None)
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("case", ["no-runtime-shape", "declared-output"])
def test_the_output_stays_as_inferred_where_nothing_hid_its_dims(case, tmp_path):
    model = llama_attention_model(mask="none" if case == "no-runtime-shape" else "causal-padding")
    if case == "declared-output":  # onnxruntime merges its inference into a declared shape: named anyway
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(
            merged_heads(model), onnx.TensorProto.FLOAT, ["batch", "sequence", 32]))
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert op_counts(result.model)[GQA] == 1 and unnamed_behind_the_attention(result.model) == [False]
    assert_same_outputs(model, result.model)
