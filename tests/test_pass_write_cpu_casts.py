"""write-cpu-casts: the Casts onnxruntime's CPU provider inserts around float16 nodes, written into
an ort-cpu model, weights' Casts first, so each weight's float32 copy lives only around its reader."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.walk_setup import walk_setup
from tests.conftest import assert_equivalent, optimize_model, saved_by_onnxruntime
from tests.graphs import GraphBuilder, op_counts

PASS = "write-cpu-casts"
WIDTH, LAYERS = 192, 4
KIB = 1024


def mlp(dtype=np.float16, layers: int = LAYERS, side=None) -> onnx.ModelProto:
    """x [batch, W] -> `layers` x (MatMul with a [W, W] weight, Add a bias, Relu), perturbed weights
    and biases: each weight's float32 copy (144 KiB) is far more than a layer's activations.
    `side`: a node (given the builder and the second layer's Add output) writing a second output."""
    b = GraphBuilder(opset=17, seed=5, extra_opsets={"com.microsoft": 1})
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    h = b.input("x", ["batch", WIDTH], elem)
    outputs = []
    for layer in range(layers):
        w = b.const((b.rand(WIDTH, WIDTH) * WIDTH ** -0.5).astype(dtype))
        added = b.op("Add", b.op("MatMul", h, w), b.const((b.rand(WIDTH) * 0.1).astype(dtype)))
        h = b.op("Relu", added)
        if side is not None and layer == 1:
            outputs.append(side(b, added))
    return b.build(h, *outputs, output_names=["y", "side"][:1 + len(outputs)])


def read_by_an_if_body(b: GraphBuilder, added: str) -> str:
    """An If whose branches read `added` (a float16 tensor only a Relu reads as an input) from the
    enclosing graph: onnxruntime counts the If among its readers, so its Cast back stays."""
    branch = {name: helper.make_graph([helper.make_node(op, [added], [name])], name, [],
                                      [helper.make_tensor_value_info(name, TensorProto.FLOAT16, None)])
              for name, op in (("then", "Identity"), ("else", "Neg"))}
    cond = b.input("cond", [], TensorProto.BOOL)
    b.nodes.append(helper.make_node("If", [cond], ["side"], name="If_1", then_branch=branch["then"],
                                    else_branch=branch["else"]))
    return "side"


def contrib_gelu(b: GraphBuilder, added: str) -> str:
    """A float16 com.microsoft Gelu in the input: the CPU provider inlines its function body."""
    return b.op("Gelu", added, domain="com.microsoft")


def casts_onnxruntime_adds(model: onnx.ModelProto) -> dict[str, str]:
    """The float32 copies the CPU provider's Casts would add to `model` (analysis/inserted_casts.py)."""
    return walk_setup(model, None, ()).graph.float_copies


def test_weights_casts_are_written_first_and_nothing_is_left_to_insert(tmp_path):
    model = mlp()
    without = optimize_model(model, tmp_path, name="without", target="ort-cpu", passes=(), dims={"batch": 2})
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,), dims={"batch": 2})
    (row,) = [r for r in result.report.fusions if r.pass_name == PASS]
    nodes = list(result.model.graph.node)
    weights = {t.name for t in result.model.graph.initializer}
    weight_casts = [n for n in nodes if n.op_type == "Cast" and n.input[0] in weights]
    assert len(weight_casts) == 2 * LAYERS  # each weight and each bias, once
    assert nodes[:len(weight_casts)] == weight_casts  # stored first: onnxruntime's walk reaches each last
    assert all(t.data_type == TensorProto.FLOAT16 for t in result.model.graph.initializer)  # not folded
    assert casts_onnxruntime_adds(model) and not casts_onnxruntime_adds(result.model)
    assert op_counts(result.model) == {**op_counts(model), "Cast": len(row.created)}
    # the graph's interface is the model's: float16 in, float16 out
    assert result.model.graph.input == model.graph.input and result.model.graph.output == model.graph.output
    before, after = without.report.memory.after.peak_bytes, result.report.memory.after.peak_bytes
    assert before - after > (LAYERS - 2) * WIDTH * WIDTH * 4, (before, after)
    assert row.peak_delta == after - before
    for batch in (1, 6):
        assert_equivalent(model, result.model, dims={"batch": batch})
    measured = [measure_peak(tmp_path / f"{name}.out.onnx", dims={"batch": 2}, repeats=1)
                for name in ("without", "model")]
    if any(m.allocated_bytes is None for m in measured):
        pytest.skip(f"cannot count allocations here: {measured[0].allocated_reason}")
    assert measured[0].allocated_bytes - measured[1].allocated_bytes > (LAYERS - 2) * WIDTH * WIDTH * 4, measured


def test_onnxruntime_runs_the_written_graph_as_written(tmp_path):
    """Loaded, the written model gets no Cast of onnxruntime's own: its saved graph has the same nodes."""
    result = optimize_model(mlp(), tmp_path, target="ort-cpu", passes=(PASS,), dims={"batch": 2})
    saved = saved_by_onnxruntime(result.model, tmp_path)
    assert op_counts(saved) == op_counts(result.model)


def test_a_second_run_keeps_the_weights_float16(tmp_path):
    """fold-constants leaves a widening Cast of a weight alone: folded, the weights would be stored
    in float32 for good (a second run of fuse doubled them)."""
    first = optimize_model(mlp(), tmp_path, name="first", target="ort-cpu", dims={"batch": 2})
    second = optimize_model(first.model, tmp_path, name="second", target="ort-cpu", dims={"batch": 2})
    assert op_counts(second.model) == op_counts(first.model)
    assert all(t.data_type == TensorProto.FLOAT16 for t in second.model.graph.initializer)
    assert second.report.memory.after.peak_bytes == first.report.memory.after.peak_bytes


@pytest.mark.parametrize("dtype, target", [(np.float32, "ort-cpu"), (np.float16, "ort-cuda"),
                                           (np.float16, "ort"), (np.float16, "onnx")],
                         ids=["float32", "cuda", "cpu-and-cuda", "onnx"])
def test_not_where_nothing_is_cast_or_another_runtime_may_run_it(tmp_path, dtype, target):
    model = mlp(dtype)
    result = optimize_model(model, tmp_path, target=target, dims={"batch": 2})
    assert not [r for r in result.report.fusions if r.pass_name == PASS]
    assert "Cast" not in op_counts(result.model)




def test_a_tensor_an_if_body_reads_keeps_its_cast_back(tmp_path):
    """The replay counts a subgraph's reads of outer tensors (inserted_casts.Step.implicit): the
    written graph still produces the float16 tensor the If body reads, and onnxruntime, which runs
    it, inserts nothing more."""
    model = mlp(side=read_by_an_if_body)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,), dims={"batch": 2})
    assert [r.pass_name for r in result.report.fusions] == [PASS]
    onnx.checker.check_model(result.model)
    saved = saved_by_onnxruntime(result.model, tmp_path)
    assert op_counts(saved) == op_counts(result.model)
    for batch in (1, 6):
        assert_equivalent(model, result.model, dims={"batch": batch})


def test_not_where_the_cpu_inlines_a_float16_function_body(tmp_path):
    """A float16 com.microsoft Gelu in the input runs as its body: onnxruntime inserts Casts around
    the body's nodes beside written ones and would not cancel them as it cancels its own (one
    float16 rounding more), and the replay does not model the body: nothing is written."""
    model = mlp(side=contrib_gelu)
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,), dims={"batch": 2})
    assert not result.report.fusions and "Cast" not in op_counts(result.model)


def test_a_rejected_candidate_leaves_the_model_as_it_was(tmp_path):
    """One layer gains nothing (its weight's Cast runs right before its reader either way): the
    nodes and the declared shapes are restored exactly."""
    model = mlp(layers=1)
    model.graph.value_info.append(helper.make_tensor_value_info("MatMul_1_out", TensorProto.FLOAT16, ["batch", WIDTH]))
    plain = optimize_model(model, tmp_path, name="plain", target="ort-cpu", passes=(), dims={"batch": 2})
    result = optimize_model(model, tmp_path, target="ort-cpu", passes=(PASS,), dims={"batch": 2})
    assert not result.report.fusions and "Cast" not in op_counts(result.model)
    assert list(result.model.graph.node) == list(plain.model.graph.node)
    assert list(result.model.graph.value_info) == list(plain.model.graph.value_info)
    assert any(vi.name == "MatMul_1_out" for vi in result.model.graph.value_info)
