"""rotary-before-head-split: RotaryEmbedding on Transpose(Reshape(x3)) heads -> on x3, split after it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.conftest import optimize_model
from tests.graphs import GraphBuilder, assert_declined, op_counts, signature
from tests.test_pass_rotary_embedding import assert_same_outputs

PASSES = ("rotary-before-head-split",)
HEADS, D, MAX_POSITIONS = 3, 8, 32


def rotary_on_heads(*, hidden: int | str = HEADS * D, perm=(0, 2, 1, 3), rotary_dim: int | None = None,
                    head_norm_axis: int | None = None):
    """x3 [batch, sequence, H*d] -> Reshape [0, 0, H, d] (-> SimplifiedLayerNormalization(axis), Qwen3's
    per-head q/k norm) -> Transpose(perm) -> RotaryEmbedding -> Neg -> y."""
    b = GraphBuilder(extra_opsets={"com.microsoft": 1})
    x3 = b.input("x", ["batch", "sequence", hidden])
    split = b.op("Reshape", x3, b.const(np.array([0, 0, HEADS, D], np.int64)))
    if head_norm_axis is not None:
        scale = b.const(np.linspace(0.5, 1.5, D if head_norm_axis in (-1, 3) else HEADS).astype(np.float32))
        split = b.op("SimplifiedLayerNormalization", split, scale, axis=head_norm_axis, epsilon=1e-6)
    heads = b.op("Transpose", split, perm=list(perm))
    angles = np.arange(MAX_POSITIONS)[:, None] * (10000.0 ** (-np.arange(D // 2) / (D // 2)))[None]
    attrs = {"rotary_embedding_dim": rotary_dim} if rotary_dim else {}
    rotated = b.op("RotaryEmbedding", heads, b.const(np.array([1], np.int64)),
                   b.const(np.cos(angles).astype(np.float32)),
                   b.const(np.sin(angles).astype(np.float32)), domain="com.microsoft", **attrs)
    model = b.build(b.op("Neg", rotated), output_names=["y"])
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT  # onnx cannot infer the contrib op
    return model


def test_rotary_moves_onto_the_projection(tmp_path):
    model = rotary_on_heads()
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    (node,) = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert node.input[0] == "x"
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["num_heads"], attrs["rotary_embedding_dim"]) == (HEADS, D)
    assert op_counts(result.model)["Transpose"] == 1
    assert_same_outputs(model, result.model, sizes=({"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 7}))


def test_other_layouts_are_not_this_pattern(tmp_path):
    model = rotary_on_heads(perm=(0, 2, 3, 1))
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses


def test_an_unproved_split_declines(tmp_path):
    model = rotary_on_heads(hidden="hidden")
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert_declined(model, result, "rotary-before-head-split", "does not provably split")


@pytest.mark.parametrize("target", ["onnx"])
def test_portable_target_never_runs_it(tmp_path, target):
    model = rotary_on_heads()
    result = optimize_model(model, tmp_path, target=target)
    assert op_counts(result.model)["com.microsoft::RotaryEmbedding"] == 1


def test_a_per_head_norm_stays_on_the_heads_and_the_rotary_moves_past_it(tmp_path):
    # Qwen3: RMSNorm over each head's Q/K, then the rotary embedding on the transposed heads
    model = rotary_on_heads(head_norm_axis=-1)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    nodes = {n.output[0]: n for n in result.model.graph.node}
    (rotary,) = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    viewed = nodes[rotary.input[0]]
    assert viewed.op_type == "Reshape" and nodes[viewed.input[0]].op_type == "SimplifiedLayerNormalization"
    assert {a.name: onnx.helper.get_attribute_value(a) for a in rotary.attribute}["num_heads"] == HEADS
    assert_same_outputs(model, result.model, sizes=({"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 7}))


def test_a_norm_across_heads_is_not_this_pattern(tmp_path):
    model = rotary_on_heads(head_norm_axis=2)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=PASSES)
    assert signature(result.model) == signature(model)
    assert not result.report.fusions and not result.report.near_misses


def standard_rotary_on_heads(*, batch_reader: dict | None = None):
    """The opset-23 form standard-rotary-embedding writes behind Qwen3's per-head norm: x3 -> Reshape
    [0, 0, H, d] -> RMSNormalization -> Transpose -> RotaryEmbedding(cos, sin caches [B, S, d/2]
    expanded over Shape(heads)[0:1]) -> y. batch_reader: the attributes of that Shape (its reader
    of the heads), {"start": 0, "end": 1} as the pass writes it."""
    b = GraphBuilder(opset=23)
    x3 = b.input("x", ["batch", "sequence", HEADS * D])
    split = b.op("Reshape", x3, b.const(np.array([0, 0, HEADS, D], np.int64)))
    normed = b.op("RMSNormalization", split, b.const(np.linspace(0.5, 1.5, D).astype(np.float32)), epsilon=1e-6)
    heads = b.op("Transpose", normed, perm=[0, 2, 1, 3])
    angles = np.arange(MAX_POSITIONS)[:, None] * (10000.0 ** (-np.arange(D // 2) / (D // 2)))[None]
    batch = b.op("Shape", heads, **(batch_reader if batch_reader is not None else {"start": 0, "end": 1}))
    if batch_reader is not None and batch_reader != {"start": 0, "end": 1}:
        batch = b.op("Slice", batch, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)))
    repeat = b.op("Concat", batch, b.const(np.array([1, 1], np.int64)), axis=0)
    length = b.op("Shape", x3, start=1, end=2)
    caches = []
    for table in (np.cos(angles), np.sin(angles)):
        rows = b.op("Slice", b.const(table[None].astype(np.float32)), b.const(np.array([0], np.int64)), length,
                    b.const(np.array([1], np.int64)))
        caches.append(b.op("Expand", rows, repeat))
    return b.build(b.op("Neg", b.op("RotaryEmbedding", heads, *caches)), output_names=["y"])


def test_standard_rotary_moves_past_a_per_head_norm_and_its_batch_is_read_off_the_projection(tmp_path):
    model = standard_rotary_on_heads()
    result = optimize_model(model, tmp_path, passes=("standard-rotary-before-head-split",))
    nodes = {n.output[0]: n for n in result.model.graph.node}
    (rotary,) = [n for n in result.model.graph.node if n.op_type == "RotaryEmbedding"]
    assert nodes[rotary.input[0]].op_type == "Reshape" and not rotary.domain
    assert {a.name: onnx.helper.get_attribute_value(a) for a in rotary.attribute}["num_heads"] == HEADS
    assert [n.input[0] for n in result.model.graph.node if n.op_type == "Shape"][0] == "x"
    assert op_counts(result.model)["Transpose"] == 1
    assert_same_outputs(model, result.model, sizes=({"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 7}))


def test_heads_read_for_more_than_their_batch_decline(tmp_path):
    model = standard_rotary_on_heads(batch_reader={})  # Shape(heads) whole, then sliced: reads more than dim 0
    result = optimize_model(model, tmp_path, passes=("standard-rotary-before-head-split",))
    assert_declined(model, result, "standard-rotary-before-head-split", "is also read by")
