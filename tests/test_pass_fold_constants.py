"""fold-constants: run-time-constant subgraphs become initializers; dead nodes go."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import numpy_helper

from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts

# Pinned, so passes added to the default pipeline cannot change what these tests exercise.
PASSES = ("fold-constants", "conv-bn")


def fusions_by_pass(result) -> Counter:
    return Counter(record.pass_name for record in result.report.fusions)


def ints(b: GraphBuilder, values) -> str:
    return b.const(np.asarray(values, np.int64))


def test_weight_built_at_run_time_folds_then_conv_bn_fires(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 4, 8, 8])
    base = b.op("Constant", value=numpy_helper.from_array(b.rand(6, 4, 3, 3), "base"))
    offset = b.op("ConstantOfShape", ints(b, [6, 4, 3, 3]),
                  value=numpy_helper.from_array(np.array([0.25], np.float32), "v"))
    conv = b.op("Conv", x, b.op("Add", base, offset), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", conv, *(b.const(b.rand(6, low=0.5, high=1.5)) for _ in range(4)))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Conv": 1}
    assert fusions_by_pass(result).keys() == {"fold-constants", "conv-bn"}
    assert fusions_by_pass(result)["conv-bn"] == 1
    assert_equivalent(model, result.model)
    assert not optimize_model(result.model, tmp_path, name="again", passes=PASSES).report.fusions


def test_shape_arithmetic_on_static_input_folds(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 3, 4, 4])
    batch = b.op("Unsqueeze", b.op("Gather", b.op("Shape", x), b.const(np.array(0, np.int64))), ints(b, [0]))
    y = b.op("Reshape", x, b.op("Concat", batch, ints(b, [-1]), axis=0))
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Reshape": 1}
    shape = next(t for t in result.model.graph.initializer if t.name == result.model.graph.node[0].input[1])
    assert numpy_helper.to_array(shape).tolist() == [2, -1]
    assert_equivalent(model, result.model)


def test_dead_node_is_removed(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    b.op("Relu", b.op("Exp", x, name="dead_exp"), name="dead_relu")
    model = b.build(b.op("Neg", x), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Neg": 1}
    assert sorted(name for r in result.report.fusions for name in r.replaced) == ["dead_exp", "dead_relu"]
    assert_equivalent(model, result.model)


@pytest.mark.parametrize("limit, folded", [(1024, False), (64 * 2**10, True)], ids=["over-limit", "under-limit"])
def test_fold_limit(tmp_path, limit, folded):
    b = GraphBuilder()
    x = b.input("x", [64, 64])
    filled = b.op("ConstantOfShape", ints(b, [64, 64]),
                  value=numpy_helper.from_array(np.array([1.5], np.float32), "v"))  # 16 KiB of float32
    model = b.build(b.op("Add", x, filled), output_names=["y"])
    result = optimize_model(model, tmp_path, fold_limit_bytes=limit, passes=PASSES)
    assert op_counts(result.model) == ({"Add": 1} if folded else {"Add": 1, "ConstantOfShape": 1})
    assert_equivalent(model, result.model)


@pytest.mark.parametrize("random_op", ["RandomUniform", "Dropout"])
def test_random_ops_are_not_folded(tmp_path, random_op):
    b = GraphBuilder()
    x = b.input("x", [2, 3])
    if random_op == "RandomUniform":
        noise = b.op("RandomUniform", shape=[2, 3])
    else:  # training mode on a constant: a fresh mask every run
        noise = b.op("Dropout", b.const(np.ones((2, 3))), b.const(0.5), b.const(True, dtype=np.bool_))
    model = b.build(b.op("Add", x, noise), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == {"Add": 1, random_op: 1}
    assert "fold-constants" not in fusions_by_pass(result)


def test_sequence_producers_are_not_folded(tmp_path):
    """SequenceEmpty has no inputs, so it looks foldable; its value is a sequence, which no
    initializer can hold (found by running fuse over onnx's backend test models)."""
    b = GraphBuilder(opset=17)
    x = b.input("x", [2, 3])
    seq = b.op("SequenceInsert", b.op("SequenceEmpty", dtype=1), x)
    model = b.build(b.op("SequenceAt", seq, b.const(np.array(0, np.int64))), output_names=["y"])
    result = optimize_model(model, tmp_path, verify=True)
    assert result.report.verification.passed
    assert op_counts(result.model) == Counter({"SequenceEmpty": 1, "SequenceInsert": 1, "SequenceAt": 1})


def filled(b: GraphBuilder, shape, fill: float) -> str:
    """A weight built at run time, as the onnx package's light zoo writes every weight."""
    return b.op("ConstantOfShape", ints(b, shape), value=numpy_helper.from_array(np.array([fill], np.float32), "v"))


def twin_branches(b: GraphBuilder, fills=(0.02, 0.02), *, bn: bool = False) -> str:
    """Two Convs on one input whose weights are built by two ConstantOfShape nodes (9 KiB each,
    over the size CSE compares by value), each branch with its own BatchNormalization when `bn`."""
    x = b.input("x", [1, 16, 8, 8])
    branches = []
    for index, fill in enumerate(fills):
        y = b.op("Conv", x, filled(b, [16, 16, 3, 3], fill), pads=[1, 1, 1, 1])
        if bn:
            y = b.op("BatchNormalization", y, *(b.const(b.rand(16, low=0.5, high=1.5)) for _ in range(4)))
        branches.append(b.op("Relu", y, name=f"relu{index}"))
    return b.op("Concat", *branches, axis=1)


def conv_weights(model) -> list[str]:
    return [n.input[1] for n in model.graph.node if n.op_type == "Conv"]


def test_equal_folded_weights_become_one_so_cse_merges_the_branches(tmp_path):
    b = GraphBuilder()
    model = b.build(twin_branches(b), output_names=["y"])
    folded = optimize_model(model, tmp_path, name="folded", passes=("fold-constants", "merge-equal-weights")).model
    first, second = conv_weights(folded)
    assert first == second and len(folded.graph.initializer) == 1  # one weight (the Convs have no bias)
    result = optimize_model(model, tmp_path, passes=("fold-constants", "merge-equal-weights",
                                                     "eliminate-common-subexpressions"))
    assert op_counts(result.model) == {"Conv": 1, "Relu": 1, "Concat": 1}
    assert_equivalent(model, result.model, rtol=0.0, atol=0.0)


def test_different_folded_weights_stay_apart(tmp_path):
    b = GraphBuilder()
    model = b.build(twin_branches(b, fills=(0.02, 0.03)), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("fold-constants", "merge-equal-weights",
                                                     "eliminate-common-subexpressions"))
    first, second = conv_weights(result.model)
    assert first != second
    assert op_counts(result.model) == {"Conv": 2, "Relu": 2, "Concat": 1}
    assert_equivalent(model, result.model, rtol=0.0, atol=0.0)


def test_onnxruntime_runs_no_more_convolutions_of_the_output_than_of_the_original(tmp_path):
    """light_inception_v2's form: identical built weights, then a BatchNormalization per branch.
    onnxruntime merges the original's twin Convs itself (before folding their weights); fuse's
    output must let it merge them too (it ran 1.05x the original at level all when it did not)."""
    from tests.test_pass_pin_gelu_bias import ort_level_all_ops

    b = GraphBuilder()
    model = b.build(twin_branches(b, bn=True), output_names=["y"])
    result = optimize_model(model, tmp_path)
    assert op_counts(result.model)["Conv"] == 1  # the shared Conv: each branch keeps its BatchNormalization

    def convolutions(counts):
        return sum(v for k, v in counts.items() if k in ("Conv", "FusedConv"))

    original, fused = ort_level_all_ops(model, tmp_path, "original"), ort_level_all_ops(result.model, tmp_path, "fused")
    assert convolutions(fused) <= convolutions(original)
    assert_equivalent(model, result.model)


def test_a_big_weight_sliced_by_computed_starts_folds(tmp_path, capfd):
    """An LSTM's gates as torch writes them: Slice(weight, starts, ends) with starts and ends built
    by Unsqueeze/Concat from constants. The weight is big (held by reference to the model file), the
    Slice's inputs become constant only once the chain before it folds, and the whole fold goes to
    onnxruntime in one session: the weight must be mapped for it too, or onnxruntime refuses the
    fold ("Absolute path not allowed for external data location") and nothing folds."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 256])
    weight = b.const(b.rand(512, 256))  # 512 KiB: above graph/weights.BIG_WEIGHT_BYTES
    starts = b.op("Concat", b.op("Unsqueeze", b.const(np.int64(128), dtype=np.int64), b.const(np.array([0], np.int64))),
                  axis=0)
    ends = b.op("Concat", b.op("Unsqueeze", b.const(np.int64(384), dtype=np.int64), b.const(np.array([0], np.int64))),
                axis=0)
    gate = b.op("Slice", weight, starts, ends, b.const(np.array([0], np.int64)))
    model = b.build(b.op("MatMul", x, b.op("Transpose", gate)), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=("fold-constants",))
    assert op_counts(result.model) == {"MatMul": 1}
    assert "Inference failed" not in capfd.readouterr().err
    assert_equivalent(model, result.model, dims={"batch": 3})


@pytest.mark.parametrize("placed", [False, True], ids=["a-models-cast", "placed-for-the-cpu"])
def test_a_cast_widening_a_weight_folds_unless_placed_before_its_reader(tmp_path, placed):
    """A Cast of a float16 weight to float32 folds, so conv-bn sees a constant weight; one named as
    onnxruntime names the Casts its CPU provider inserts (write-cpu-casts writes them so) stays:
    folded, the weight would be stored in float32 for good."""
    from onnx import helper

    from fuse_cli.analysis.inserted_casts import CAST_PREFIX

    b = GraphBuilder()
    x = b.input("x", [2, 4, 8, 8])
    weight = b.const(b.rand(6, 4, 3, 3).astype(np.float16))
    widened = f"{CAST_PREFIX}{weight}"
    b.nodes.append(helper.make_node("Cast", [weight], [widened], to=1,
                                    name=widened if placed else "Cast_of_the_weight"))
    conv = b.op("Conv", x, widened)
    bn = [b.const(v) for v in (b.rand(6, low=0.5), b.rand(6), b.rand(6), b.rand(6, low=0.5))]
    model = b.build(b.op("BatchNormalization", conv, *bn), output_names=["y"])
    result = optimize_model(model, tmp_path, passes=PASSES)
    assert op_counts(result.model) == ({"Cast": 1, "Conv": 1, "BatchNormalization": 1} if placed else {"Conv": 1})
    assert_equivalent(model, result.model, rtol=1e-3, atol=1e-4)
