"""cached-attention: a decoder's attention over its KV cache (present = Concat(past, new), repeated
by repeat_kv or not) -> com.microsoft MultiHeadAttention; and group-query-attention's prefill with
present outputs."""

from __future__ import annotations

import pytest

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import planner_shapes, profile_memory
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.verify import verify_models
from tests.conftest import optimize_model
from tests.graphs import assert_declined, op_counts
from tests.llama_graphs import llama_attention_model
from tests.test_pass_group_query_attention import unnamed_behind_the_attention

MHA, GQA = "com.microsoft::MultiHeadAttention", "com.microsoft::GroupQueryAttention"
TOTAL = "past_sequence + sequence"
# distinct primes for distinct symbols, and a decode step of one token
SIZES = ({"batch": 3, "sequence": 5, "past_sequence": 7, TOTAL: 12},
         {"batch": 5, "sequence": 1, "past_sequence": 11, TOTAL: 12})
MASK_VALUES = {"attention_mask": (0, 2), "position_ids": (0, 64)}


def assert_same_outputs(original, fused) -> None:
    for dims in SIZES:
        for seed in (0, 1):
            result = verify_models(original, fused, dims=dims, seed=seed, rtol=1e-4, atol=1e-5, int_ranges=MASK_VALUES)
            assert result.passed, result.outputs


def rotated(tmp_path, **kwargs):
    """The decode-step block after rotary-embedding, as the attentions find it in the pipeline."""
    model = llama_attention_model(cache="past", **kwargs)
    model = optimize_model(model, tmp_path, name="rotated", target="ort-cpu", passes=("rotary-embedding",)).model
    # as an exporter writes it: no inferred shapes (onnx's unk__N placeholders would read as symbols)
    del model.graph.value_info[:]
    return model


FORMS = {
    "grouped-kv-repeated": dict(),
    "three-groups": dict(heads=6, kv_heads=2),
    "one-kv-head-per-head": dict(kv_heads=4, repeat="none"),
    "custom-scale": dict(scale="div"),
    "no-mask": dict(mask="none"),
    "dynamo-sdpa": dict(dynamo=True),
    # transformers 5.x's decode step: position_ids given, cos/sin one row per (batch, position)
    "position-ids-given": dict(positions="input"),
    "position-ids-given-dynamo-sdpa": dict(positions="input", dynamo=True),
}


@pytest.mark.parametrize("form", FORMS)
def test_decode_step_attention_fuses_into_multi_head_attention(form, tmp_path):
    kwargs = FORMS[form]
    model = rotated(tmp_path, **kwargs)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("group-query-attention", "cached-attention"))
    counts = op_counts(result.model)
    # repeat_kv'd K/V: one node per member of the query groups (heads / kv_heads), over the cache
    # as it is: the repeat's Expand is gone
    members = kwargs.get("heads", 4) // kwargs.get("kv_heads", 2)
    assert counts[MHA] == members and "Softmax" not in counts and GQA not in counts, counts
    assert "Expand" not in counts and counts.get("Split", 0) == (members > 1), counts
    # the cache stays as the graph computes it: its Concats are the present outputs
    assert counts["Concat"] >= 2
    assert [o.name for o in result.model.graph.output] == ["y", "present_key", "present_value"]
    assert_same_outputs(model, result.model)


# K/V repeated otherwise than repeat_kv's groups, or a mask per head: one MultiHeadAttention over
# the repeated K/V, as the graph repeats them
OVER_THE_REPEAT = {
    "tiled-not-grouped": dict(repeat="tile"),
    "mask-per-head": dict(mask="per-head"),
}


@pytest.mark.parametrize("form", OVER_THE_REPEAT)
def test_query_groups_are_not_split_where_the_repeat_or_mask_forbids(form, tmp_path):
    model = rotated(tmp_path, **OVER_THE_REPEAT[form])
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("cached-attention",))
    counts = op_counts(result.model)
    assert counts[MHA] == 1 and counts["Expand"] >= 2 and "Split" not in counts and "Softmax" not in counts, counts
    assert_same_outputs(model, result.model)


def test_the_full_runtime_pipeline_fuses_a_decode_step(tmp_path):
    model = llama_attention_model(cache="past")
    result = optimize_model(model, tmp_path, target="ort-cpu")
    counts = op_counts(result.model)
    assert counts[MHA] == 2 and "Softmax" not in counts and "Expand" not in counts, counts  # 4 heads over 2
    # the members' query view Reshape(q, Shape(q)) survives the Reshape folding passes
    shapes = planner_shapes(result.model)
    assert {shapes[n.output[0]].shape for n in result.model.graph.node if n.op_type == "MultiHeadAttention"} == {
        (None, None, 16)}
    assert_same_outputs(model, result.model)
    # the memory model counts the members' nodes and scratch as onnxruntime allocates them
    dims = {"batch": 16, "sequence": 64, "past_sequence": 64, TOTAL: 128}
    estimate = profile_memory(result.model, infer_shapes(result.model, dims=dims, symbolic=True)).peak_bytes
    exact = measure_peak(result.model, dims=dims, repeats=1).allocated_bytes
    if exact is None:
        pytest.skip("memray is not installed: no exact count")
    assert abs(exact - estimate) <= 0.02 * exact, (estimate, exact)


@pytest.mark.parametrize("form", {"repeated": dict(), "one-kv-head-per-head": dict(kv_heads=4, repeat="none")})
def test_a_prefill_with_present_outputs_fuses_into_group_query_attention(form, tmp_path):
    model = llama_attention_model(cache="present", **{"grouped-kv-repeated": {}, **FORMS}.get(form, {}))
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("rotary-embedding", "group-query-attention"))
    counts = op_counts(result.model)
    assert counts[GQA] == 1 and "Softmax" not in counts and "Transpose" not in counts, counts
    (node,) = [n for n in result.model.graph.node if n.op_type == "GroupQueryAttention"]
    assert list(node.output)[1:] == ["present_key", "present_value"]
    sizes = [{"batch": 3, "sequence": 7}, {"batch": 5, "sequence": 11}]
    for dims in sizes:
        assert verify_models(model, result.model, dims=dims, seed=0, rtol=1e-4, atol=1e-5,
                             int_ranges=MASK_VALUES).passed


DECLINES = {
    "rank-2-mask": (dict(mask="causal-2d"), "is not provably [batch or 1, 1 or 4, sequence, key length]"),
    "mask-broadcast-over-queries": (dict(mask="padding-only"),
                                    "is not provably [batch or 1, 1 or 4, sequence, key length]"),
    "dynamo-flattened-to-d-first": (dict(dynamo=True, flat_shape="d-first"),
                                    "are not provably K^T through a batch-flattened view"),
    "soft-capped-scores": (dict(softcap=(0.7, 0.7)), "MultiHeadAttention has no soft cap"),
}


@pytest.mark.parametrize("case", DECLINES)
def test_near_forms_decline_with_the_reason(case, tmp_path):
    kwargs, reason = DECLINES[case]
    model = rotated(tmp_path, **kwargs)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("cached-attention",))
    assert_declined(model, result, "cached-attention", reason)


def test_targets_with_cuda_fuse_it_too(tmp_path):
    """MultiHeadAttention has a float32 kernel on both providers."""
    model = rotated(tmp_path)
    result = optimize_model(model, tmp_path, target="ort", passes=("cached-attention",))
    assert op_counts(result.model)[MHA] == 2  # one per member of the query groups (4 heads over 2)


@pytest.mark.parametrize("mask", ["causal-padding", "none"])
def test_a_decode_steps_output_is_unnamed_only_behind_a_runtime_shaped_mask(mask, tmp_path):
    model = rotated(tmp_path, mask=mask, repeat="none", kv_heads=4)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("cached-attention",))
    assert op_counts(result.model)[MHA] == 1
    assert unnamed_behind_the_attention(result.model) == [mask != "none"]
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("mask", ["causal-padding", "none"])
def test_query_group_members_are_unnamed_to_the_planner_only_behind_a_runtime_shaped_mask(mask, tmp_path):
    """The members' tensors are new: named, onnxruntime's planner hands their buffers to the next
    layer's members and holds them across the MLP in between, where the replaced subgraph's
    runtime-shaped tensors shared with nothing (toolkit.query_groups)."""
    model = rotated(tmp_path, mask=mask)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("cached-attention",))
    shapes = planner_shapes(result.model)
    members = [n.output[0] for n in result.model.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(members) == 2
    expected = (None, None, 16) if mask != "none" else ("batch", "sequence", 16)
    assert [shapes[name].shape for name in members] == [expected] * 2
    assert_same_outputs(model, result.model)


DECODE_STEPS_WITH_POSITION_IDS = {
    "llama": dict(),
    "phi3-partial-rotary": dict(partial=True),
    "qwen3-head-norm": dict(head_norm=True),
    "dynamo-sdpa": dict(dynamo=True),
}
ATTENTION_AT = {"ort-cpu": (dict(target="ort-cpu"), MHA, "com.microsoft::RotaryEmbedding", 2),
                "opset-23": (dict(upgrade_opset=23), "Attention", "RotaryEmbedding", 1)}


@pytest.mark.parametrize("target", ATTENTION_AT)
@pytest.mark.parametrize("form", DECODE_STEPS_WITH_POSITION_IDS)
def test_decode_steps_given_position_ids_fuse_in_the_default_pipelines(form, target, tmp_path):
    # issue 32: transformers 5.x's decode step (position_ids an input) fused no attention at all
    model = llama_attention_model(cache="past", positions="input", **DECODE_STEPS_WITH_POSITION_IDS[form])
    config, attention, rotary, attentions = ATTENTION_AT[target]
    result = optimize_model(model, tmp_path, **config)
    counts = op_counts(result.model)
    assert counts[rotary] == 2 and counts[attention] == attentions and "Softmax" not in counts, counts
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo-sdpa"])
def test_a_float16_decode_step_fuses_for_the_cpu_where_its_attention_ran_in_float32(dynamo, tmp_path):
    """No float16 MatMul, Softmax or Add kernel on the CPU provider: the decode step's attention ran
    in float32 between Casts onnxruntime inserts, as the float32-only MultiHeadAttention does (dynamo's
    IsNaN guard reads float16 but writes booleans). The whole pipeline: TorchScript's softmax in float32
    between Casts is folded by the Cast passes first."""
    model = rotated(tmp_path, dtype="float16", dynamo=dynamo)
    result = optimize_model(model, tmp_path, target="ort-cpu")
    counts = op_counts(result.model)
    assert counts[MHA] == 2 and "Softmax" not in counts, counts
    for dims in SIZES:
        outcome = verify_models(model, result.model, dims=dims, int_ranges=MASK_VALUES)
        assert outcome.passed, outcome.outputs
