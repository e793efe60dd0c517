"""rotary-embedding: the rotate-half RoPE of Llama/Qwen2 exports -> com.microsoft RotaryEmbedding."""

from __future__ import annotations

import pytest

from fuse_cli.verify import verify_models
from tests.conftest import optimize_model
from tests.graphs import op_counts
from tests.llama_graphs import llama_attention_model

ROPE = "com.microsoft::RotaryEmbedding"
SIZES = ({"batch": 1, "sequence": 3}, {"batch": 3, "sequence": 7})
MASK_VALUES = {"attention_mask": (0, 2)}


def assert_same_outputs(original, fused, sizes=SIZES) -> None:
    for dims in sizes:
        for seed in (0, 1):
            result = verify_models(original, fused, dims=dims, seed=seed, rtol=1e-4, atol=1e-5, int_ranges=MASK_VALUES)
            assert result.passed, result.outputs


FORMS = {
    "positions-times-inv-freq": dict(),
    "inv-freq-matmul": dict(freqs="matmul"),
    "constant-bounds": dict(half_bounds="const"),
    "grouped-kv-heads": dict(heads=6, kv_heads=2),
    "dynamo-run-time-split": dict(dynamo=True),
}


@pytest.mark.parametrize("form", FORMS)
def test_rotate_half_fuses_into_rotary_embedding(form, tmp_path):
    model = llama_attention_model(**FORMS[form])
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("rotary-embedding",))
    counts = op_counts(result.model)
    assert counts[ROPE] == 2 and "Neg" not in counts, counts  # Q and K
    heads = [next(a.i for a in n.attribute if a.name == "num_heads") for n in result.model.graph.node
             if n.op_type == "RotaryEmbedding"]  # run on the [B, S, H*d] projections
    assert sorted(heads) == sorted([FORMS[form].get("heads", 4), FORMS[form].get("kv_heads", 2)])
    assert_same_outputs(model, result.model)
    again = optimize_model(result.model, tmp_path, name="again", target="ort-cpu", passes=("rotary-embedding",))
    assert not again.report.fusions


def test_a_constant_table_with_equal_halves_fuses(tmp_path):
    model = llama_attention_model(tables="constant", seq=6, mask="none")
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("rotary-embedding",))
    assert op_counts(result.model)[ROPE] == 2
    assert_same_outputs(model, result.model, sizes=({"batch": 2},))


DECLINES = {
    "uneven-halves": (dict(tables="uneven"), "are not provably equal"),
    "tables-are-inputs": (dict(tables="inputs"), "are not provably equal"),
    "split-off-center": (dict(half_bounds="wrong"), "not [0:4] of the last axis"),
}


@pytest.mark.parametrize("case", DECLINES)
def test_near_forms_decline_with_the_reason(case, tmp_path):
    kwargs, reason = DECLINES[case]
    model = llama_attention_model(**kwargs)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("rotary-embedding",))
    assert not result.report.fusions and ROPE not in op_counts(result.model)
    misses = [m.reason for m in result.report.near_misses if m.pass_name == "rotary-embedding"]
    assert len(misses) == 2 and all(reason in miss for miss in misses), misses  # Q's and K's


def test_rotating_the_wrong_half_is_not_rotate_half(tmp_path):
    model = llama_attention_model(rotate_order="neg-lower")
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("rotary-embedding",))
    assert ROPE not in op_counts(result.model)


def test_the_portable_target_leaves_it(tmp_path):
    result = optimize_model(llama_attention_model(), tmp_path, target="onnx")
    assert ROPE not in op_counts(result.model)


# A decode step's rotary: cos/sin computed from the position_ids given to the model, one row per
# (batch, position). Two settings with distinct sizes for batch, sequence and past (1 new token,
# then several); position ids drawn at random, so each batch row reads rows of its own.
STEP_SIZES = ({"batch": 2, "sequence": 1, "past_sequence": 5}, {"batch": 3, "sequence": 4, "past_sequence": 9})
STEP_VALUES = {**MASK_VALUES, "position_ids": (0, 64)}
POSITION_IDS_FORMS = {
    "positions-times-inv-freq": dict(),
    "inv-freq-matmul": dict(freqs="matmul"),
    "dynamo-run-time-split": dict(dynamo=True),
    "decode-step-with-past": dict(cache="past"),
}


def assert_same_step_outputs(original, fused) -> None:
    for dims in STEP_SIZES:
        for seed in (0, 1):
            result = verify_models(original, fused, dims=dims, seed=seed, rtol=1e-4, atol=1e-5, int_ranges=STEP_VALUES)
            assert result.passed, result.outputs


@pytest.mark.parametrize("form", POSITION_IDS_FORMS)
def test_tables_from_given_position_ids_fuse_with_one_row_per_batch_and_position(form, tmp_path):
    model = llama_attention_model(positions="input", **POSITION_IDS_FORMS[form])
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=("rotary-embedding",))
    counts = op_counts(result.model)
    assert counts[ROPE] == 2 and "Neg" not in counts, counts
    ids = [n.input[1] for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert all(i not in {t.name for t in result.model.graph.initializer} for i in ids)  # row ids, not a start
    assert_same_step_outputs(model, result.model)


STEP_DECLINES = {
    # position_ids [rows, S]: rows may be 1 at run time and broadcast over the batch
    "position-ids-of-another-batch": (dict(positions="other-batch"), "with x's batch"),
    "cos-per-batch-row-sin-per-position": (dict(positions="mixed"), "the other one per position"),
}


@pytest.mark.parametrize("case", STEP_DECLINES)
def test_near_decode_forms_decline_with_the_reason(case, tmp_path):
    kwargs, reason = STEP_DECLINES[case]
    result = optimize_model(llama_attention_model(**kwargs), tmp_path, target="ort-cpu", passes=("rotary-embedding",))
    assert ROPE not in op_counts(result.model)
    misses = [m.reason for m in result.report.near_misses if m.pass_name == "rotary-embedding"]
    assert len(misses) == 2 and all(reason in miss for miss in misses), misses


@pytest.mark.parametrize("form", POSITION_IDS_FORMS)
def test_tables_from_given_position_ids_fuse_into_the_standard_operator(form, tmp_path):
    # opset 23's RotaryEmbedding without position_ids reads row (b, s) of caches [B, S, d/2]: the
    # tables' first halves as they are, no Expand over the batch; the decode step's attention then fuses
    model = llama_attention_model(positions="input", **POSITION_IDS_FORMS[form])
    result = optimize_model(model, tmp_path, upgrade_opset=23,
                            passes=("standard-rotary-embedding", "standard-attention"))
    counts = op_counts(result.model)
    assert counts["RotaryEmbedding"] == 2 and counts["Attention"] == 1 and "Neg" not in counts, counts
    assert "Expand" not in counts, counts
    rotary = next(n for n in result.model.graph.node if n.op_type == "RotaryEmbedding")
    assert len(rotary.input) == 3  # X, cos_cache, sin_cache: no position_ids
    assert_same_step_outputs(model, result.model)
