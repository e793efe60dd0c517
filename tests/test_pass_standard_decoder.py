"""standard-rotary-embedding and standard-attention: a decoder's rotary embedding and attention
(prefill, or a decode step over its KV cache; grouped K/V or not) -> ONNX's opset-23
RotaryEmbedding and Attention, for --target onnx, checked against the original in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from fuse_cli import targets
from fuse_cli.pipeline.registry import pipeline_for
from fuse_cli.report.upgrade_hint import upgrade_hint_lines
from fuse_cli.verify import verify_models
from tests.conftest import MASKED_THROUGHOUT, assert_float16_outputs_match, optimize_model
from tests.graphs import assert_declined, op_counts
from tests.llama_graphs import llama_attention_model
from tests.test_pass_cached_attention import MASK_VALUES, SIZES, assert_same_outputs

PASSES = ("standard-rotary-embedding", "standard-attention")


def upgraded(model: onnx.ModelProto, tmp_path, passes=PASSES, name="model"):
    return optimize_model(model, tmp_path, name=name, upgrade_opset=23, passes=passes)


def attrs_of(model: onnx.ModelProto, op: str) -> dict:
    (node,) = [n for n in model.graph.node if n.op_type == op]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


FORMS = {  # llama_attention_model's switches, the heads and K/V heads, whether a decode step
    "prefill-grouped": (dict(), 4, 2),
    "prefill-no-mask": (dict(mask="none"), 4, 2),
    "prefill-three-groups": (dict(heads=6, kv_heads=2), 6, 2),
    "prefill-custom-scale": (dict(scale="div"), 4, 2),
    "prefill-no-repeat": (dict(kv_heads=4, repeat="none"), 4, 4),
    "prefill-present-outputs": (dict(cache="present"), 4, 2),
    "prefill-dynamo-sdpa": (dict(dynamo=True), 4, 2),
    "prefill-merged-into-rows": (dict(dynamo=True, merge="rows"), 4, 2),
    "decode-grouped": (dict(cache="past"), 4, 2),
    "decode-no-repeat": (dict(cache="past", kv_heads=4, repeat="none"), 4, 4),
    "decode-dynamo-sdpa": (dict(cache="past", dynamo=True), 4, 2),
}


@pytest.mark.parametrize("form", FORMS)
def test_decoder_attention_fuses_into_standard_operators(form, tmp_path):
    kwargs, heads, kv_heads = FORMS[form]
    model = llama_attention_model(**kwargs)
    result = upgraded(model, tmp_path)
    counts = op_counts(result.model)
    assert counts["Attention"] == 1 and counts["RotaryEmbedding"] == 2 and "Softmax" not in counts, counts
    assert not any(n.domain for n in result.model.graph.node)  # standard operators only
    attrs = attrs_of(result.model, "Attention")
    assert (attrs["q_num_heads"], attrs["kv_num_heads"], attrs["is_causal"]) == (heads, kv_heads, 0)
    assert attrs.get("scale") == (pytest.approx(1 / 3) if kwargs.get("scale") == "div" else None)
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    if kwargs.get("cache") == "past":  # the cache Concat is gone: past in, present out
        assert list(node.input)[4:] == ["past_key", "past_value"] and list(node.output)[1:] == ["present_key",
                                                                                             "present_value"]
        assert counts["Concat"] <= 3, counts  # shape vectors only
    else:  # ONNX allows present outputs only with past inputs: a prefill's present heads stay as computed
        assert len(node.output) == 1
    onnx.checker.check_model(result.model, full_check=True)
    assert_same_outputs(model, result.model)


def test_the_onnx_pipeline_fuses_them_after_an_upgrade(tmp_path):
    model = llama_attention_model(cache="past")
    result = optimize_model(model, tmp_path, upgrade_opset=23)
    counts = op_counts(result.model)
    assert counts["Attention"] == 1 and counts["RotaryEmbedding"] == 2 and counts["RMSNormalization"] == 0, counts
    assert_same_outputs(model, result.model)


def test_rows_masked_throughout_stay_as_the_graph_computes_them(tmp_path):
    """attention_mask all zeros masks every row with float32's lowest value: the graph averages V
    there, onnxruntime's Attention would write zeros without the clamp."""
    model = llama_attention_model(cache="past")
    result = upgraded(model, tmp_path)
    assert op_counts(result.model)["Max"] == 1
    for dims in ({"batch": 3, "sequence": 5, "past_sequence": 7, "past_sequence + sequence": 12},):
        check = verify_models(model, result.model, dims=dims, seed=0, rtol=1e-4, atol=1e-5,
                              int_ranges={"attention_mask": (0, 1)})
        assert check.passed, check.outputs


@pytest.mark.parametrize("cache", ["none", "past"])
def test_a_rotary_behind_a_per_head_norm_moves_onto_the_projection_and_attention_fuses(cache, tmp_path):
    # Qwen3: each Q/K head is RMS-normalized between split and Transpose; the rotary fused on the
    # heads moves past the norm, and standard-attention reads Q and K as projections
    model = llama_attention_model(head_norm=True, cache=cache)
    passes = ("rms-norm", "standard-rotary-embedding", "standard-rotary-before-head-split", "standard-attention")
    result = upgraded(model, tmp_path, passes=passes)
    counts = op_counts(result.model)
    assert counts["Attention"] == 1 and counts["RotaryEmbedding"] == 2 and counts["RMSNormalization"] == 2, counts
    assert "Softmax" not in counts
    rotary = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("num_heads") in (4, 2)
               for n in rotary)  # the 3-D form: heads given
    assert_same_outputs(model, result.model)


@pytest.mark.parametrize("cache", ["none", "past"])
def test_a_float16_per_head_norm_is_one_node_so_the_rotary_moves_and_attention_fuses(cache, tmp_path):
    """Qwen3 in half: each head's norm is Cast, RMSNorm in float32, Cast back, Mul(gamma16); rms-norm
    makes it one RMSNormalization (stash_type 1), the one node the rotary's move steps over."""
    model = llama_attention_model(head_norm=True, cache=cache, dtype="float16")
    passes = ("fuse-casts", "rms-norm", "standard-rotary-embedding", "standard-rotary-before-head-split",
              "standard-attention")
    result = upgraded(model, tmp_path, passes=passes)
    counts = op_counts(result.model)
    assert counts["Attention"] == 1 and counts["RotaryEmbedding"] == 2 and counts["RMSNormalization"] == 2, counts
    assert "Softmax" not in counts
    assert_float16_outputs_match(model, result.model, SIZES)


def test_without_the_move_a_rotary_behind_a_per_head_norm_keeps_the_attention_unfused(tmp_path):
    model = llama_attention_model(head_norm=True)
    result = upgraded(model, tmp_path, passes=("rms-norm", "standard-rotary-embedding", "standard-attention"))
    counts = op_counts(result.model)
    assert counts["RotaryEmbedding"] == 2 and counts["Attention"] == 0, counts
    assert_same_outputs(model, result.model)


def test_a_runtime_shaped_mask_keeps_the_output_unnamed_to_the_planner(tmp_path):
    model = llama_attention_model()  # the TorchScript mask: Expand to a shape computed at run time
    result = upgraded(model, tmp_path)
    (attention,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    shape_of = {n.output[0]: n.input[0] for n in result.model.graph.node if n.op_type == "Shape"}
    views = [n for n in result.model.graph.node if n.op_type == "Reshape" and shape_of.get(n.input[1]) == n.input[0]]
    chain = {attention.output[0]}
    for n in result.model.graph.node:  # the merge's row Reshape, if any, then the view
        if n.op_type == "Reshape" and n.input[0] in chain:
            chain.add(n.output[0])
    assert any(v.input[0] in chain for v in views)
    assert_same_outputs(model, result.model)


def test_old_opset_waits_for_the_upgrade(tmp_path):
    result = optimize_model(llama_attention_model(), tmp_path, passes=PASSES)
    assert "Attention" not in op_counts(result.model) and "RotaryEmbedding" not in op_counts(result.model)
    reasons = [m.reason for m in result.report.near_misses if m.pass_name in PASSES]
    assert reasons and all("pass --upgrade-opset 23" in r for r in reasons), reasons
    (line,) = upgrade_hint_lines(result.report)
    assert "--upgrade-opset 23" in line


def test_onnxruntime_targets_keep_their_contrib_forms():
    for target in ("ort", "ort-cpu", "ort-cuda"):
        assert not set(PASSES) & set(pipeline_for(target))
    assert set(PASSES) <= set(pipeline_for("onnx"))


DECLINES = {
    "tiled-not-repeated": ("standard-attention", dict(repeat="tile"), "is not provably repeat_kv"),
    "rank-2-mask": ("standard-attention", dict(mask="causal-2d"),
                    "is not provably [batch or 1, 1 or 4, sequence, key length]"),
    "padding-only-mask": ("standard-attention", dict(cache="past", mask="padding-only"),
                          "does not broadcast attn_mask over the queries"),
    "dynamo-flattened-to-d-first": ("standard-attention", dict(dynamo=True, flat_shape="d-first", seq=8),
                                    "are not provably K^T through a batch-flattened view"),
    "uneven-tables": ("standard-rotary-embedding", dict(tables="uneven"), "are not provably equal"),
    "wrong-half": ("standard-rotary-embedding", dict(half_bounds="wrong"), "not [0:4] of the last axis"),
    "neg-lower-not-rotate-half": ("standard-rotary-embedding", dict(rotate_order="neg-lower"),
                                  "not [0:4] of the last axis"),
    # the float16 copies decline what their float32 copies decline, for the same reason
    "float16-tiled-not-repeated": ("standard-attention", dict(repeat="tile", dtype="float16"),
                                   "is not provably repeat_kv"),
    "float16-rank-2-mask": ("standard-attention", dict(mask="causal-2d", dtype="float16"),
                            "is not provably [batch or 1, 1 or 4, sequence, key length]"),
    "float16-uneven-tables": ("standard-rotary-embedding", dict(tables="uneven", dtype="float16"),
                              "are not provably equal"),
}


@pytest.mark.parametrize("case", DECLINES)
def test_near_forms_decline_with_the_reason(case, tmp_path):
    name, kwargs, reason = DECLINES[case]
    model = llama_attention_model(**kwargs)
    half_float = kwargs.get("dtype") == "float16"
    if name == "standard-attention":  # as the pipeline finds it: rotary embeddings (and float16's casts) fused
        before = ("fuse-casts", "standard-rotary-embedding") if half_float else ("standard-rotary-embedding",)
        model = upgraded(model, tmp_path, passes=before, name="rotated").model
    result = upgraded(model, tmp_path, passes=(name,))
    assert not result.report.fusions
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == name][:1]
    assert reason in miss
    if half_float:
        assert_float16_outputs_match(model, result.model, SIZES)
    else:
        assert_same_outputs(model, result.model)


def test_what_onnxruntime_does_not_run_is_declined():
    assert targets.standard_reason("RotaryEmbedding", np.float32, "onnx") is None
    assert "no float64 RotaryEmbedding kernel" in targets.standard_reason("RotaryEmbedding", np.float64, "onnx")
    assert "no float64 Attention kernel" in targets.emit_reason("onnx", "Attention", np.float64, "")
    # the CUDA kernels are unchecked: a target that promises CUDA declines them, the CPU target does not
    assert "not checked" in targets.emit_reason("ort-cuda", "Attention", np.float32, "")
    assert targets.emit_reason("ort-cpu", "Attention", np.float32, "") is None
    # onnxruntime's com.microsoft operators of the same names are not affected
    assert targets.emit_reason("ort-cuda", "RotaryEmbedding", np.float16) is None


@pytest.mark.parametrize("cache", ["none", "past"], ids=["prefill", "decode"])
def test_soft_capped_scores_are_the_operators_softcap(cache, tmp_path, monkeypatch):
    """Gemma2's tanh(s / c) * c before the mask is Attention's softcap, applied in that order (where
    a target takes it: onnxruntime's CPU kernel is measured slower, targets.SLOWER)."""
    monkeypatch.setattr(targets, "SLOWER", tuple(s for s in targets.SLOWER if not s.op.endswith(":softcap")))
    model = llama_attention_model(cache=cache, softcap=(0.7, 0.7))
    result = upgraded(model, tmp_path)
    assert attrs_of(result.model, "Attention")["softcap"] == pytest.approx(0.7)
    assert "Tanh" not in op_counts(result.model)
    assert_same_outputs(model, result.model)


def test_soft_capped_scores_stay_where_the_kernel_is_slower(tmp_path):
    model = upgraded(llama_attention_model(softcap=(0.7, 0.7)), tmp_path, passes=("standard-rotary-embedding",),
                     name="rotated").model
    result = upgraded(model, tmp_path, passes=("standard-attention",))
    assert_declined(model, result, "standard-attention", "Attention with a soft cap measured 1.5-2.0x")


FLOAT16_FORMS = {  # llama_attention_model(dtype="float16", ...): what torch writes for model.half()
    "prefill-torchscript": dict(),
    "prefill-dynamo-sdpa": dict(dynamo=True),
    "decode-torchscript": dict(cache="past"),
    "decode-dynamo-sdpa": dict(cache="past", dynamo=True),
    "decode-position-ids-given": dict(cache="past", positions="input"),
}
def float16_fused(form: str, tmp_path):
    model = llama_attention_model(dtype="float16", **FLOAT16_FORMS[form])
    # fuse-casts first, as the pipeline runs it: the TorchScript softmax's Cast to float32 and back is exact
    return model, upgraded(model, tmp_path, passes=("fuse-casts", *PASSES))


@pytest.mark.parametrize("form", FLOAT16_FORMS)
def test_float16_decoder_attention_fuses_with_its_mask_widened(form, tmp_path):
    """fp16 copies fuse what their fp32 copies fuse: the float16 mask goes in as Max(Cast(mask,
    float32), -1e30), the masked softmax the CPU provider runs for the original in float32."""
    model, result = float16_fused(form, tmp_path)
    counts = op_counts(result.model)
    assert counts["Attention"] == 1 and counts["RotaryEmbedding"] == 2 and "Softmax" not in counts, counts
    producers = {out: n for n in result.model.graph.node for out in n.output}
    (node,) = [n for n in result.model.graph.node if n.op_type == "Attention"]
    clamp = producers[node.input[3]]
    widen = producers[clamp.input[0]]
    assert (clamp.op_type, widen.op_type) == ("Max", "Cast")
    assert onnx.helper.get_attribute_value(widen.attribute[0]) == onnx.TensorProto.FLOAT
    onnx.checker.check_model(result.model, full_check=True)
    assert_float16_outputs_match(model, result.model, SIZES)


def test_a_float16_mask_left_in_float16_changes_rows_masked_throughout(tmp_path):
    """Why the widening: the same Attention fed the float16 mask clamped in float16 (one ulp above
    its lowest, which the kernel would zero a row for) adds it in float16, where s + -65472 rounds
    to -65472 and a row masked throughout averages V uniformly; onnxruntime's run of the original
    keeps softmax(s) there. Verification sees it."""
    model, result = float16_fused("decode-torchscript", tmp_path)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(result.model)
    producers = {out: n for n in wrong.graph.node for out in n.output}
    (node,) = [n for n in wrong.graph.node if n.op_type == "Attention"]
    clamp = producers[node.input[3]]
    widen = producers[clamp.input[0]]
    floor = [t for t in wrong.graph.initializer if t.name == clamp.input[1]][0]
    floor.CopyFrom(onnx.numpy_helper.from_array(np.nextafter(np.finfo(np.float16).min, np.float16(0)), floor.name))
    clamp.input[0] = widen.input[0]
    wrong.graph.node.remove(widen)
    del wrong.graph.value_info[:]  # the clamp's output, declared float32, is float16 here
    dims = SIZES[0]
    assert verify_models(model, wrong, dims=dims, seed=0, int_ranges=MASK_VALUES).passed  # rows partly masked
    assert not verify_models(model, wrong, dims=dims, seed=0, int_ranges=MASKED_THROUGHOUT).passed
    assert verify_models(model, result.model, dims=dims, seed=0, int_ranges=MASKED_THROUGHOUT).passed

