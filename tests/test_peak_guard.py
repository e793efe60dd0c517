"""The peak guard: fuse never writes a model whose estimated peak activation memory exceeds the
original's (at the bound dims and at a larger setting), unless --allow-peak-growth; the passes it
leaves out are named with the reason, and the savings table's peak column adds up."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from fuse_cli import api
from fuse_cli.audit import LARGER, LARGER_AT_LEAST, PEAK_TOLERANCE_MIN_BYTES
from fuse_cli.cli import cli
from fuse_cli.config import FuseConfig
from tests.attention_graphs import bert
from tests.conftest import SAMPLES
from tests.graphs import op_counts

MHA = "com.microsoft::MultiHeadAttention"
DIMS = {"batch": 2, "sequence": 16}


def test_a_fusion_that_raises_the_estimated_peak_is_left_out_and_said_why(tmp_path):
    """A small BERT layer: MultiHeadAttention's head-major Q/K/V copies outweigh what it removes
    (at batch 2 x sequence 16 by 24 KiB, beyond the 4 KiB tolerance)."""
    path = tmp_path / "bert.onnx"
    onnx.save(bert(14, False), path)
    report = api.optimize(path, FuseConfig(target="ort-cpu", dims=DIMS), tmp_path / "out.onnx").report
    (decline,) = report.peak_guard
    assert decline.pass_name == "attention"
    assert all(g.after_bytes > g.before_bytes + g.tolerance_bytes for g in decline.growth)
    (miss,) = [m for m in report.near_misses if m.pass_name == "attention"]
    assert miss.reason.startswith("raises the estimated peak activation memory by")
    assert "--allow-peak-growth" in miss.reason
    written = onnx.load(tmp_path / "out.onnx")
    assert MHA not in op_counts(written)
    assert report.memory.after.peak_bytes <= report.memory.before.peak_bytes
    assert report.exit_code == 0 and report.verification.passed

    allowed = api.optimize(path, FuseConfig(target="ort-cpu", dims=DIMS, allow_peak_growth=True),
                           tmp_path / "allowed.onnx")
    # attention's MultiHeadAttention, then packed-attention's Attention over its projections
    assert op_counts(allowed.model)["com.microsoft::Attention"] == 1 and not allowed.report.peak_guard
    assert allowed.report.memory.after.peak_bytes > allowed.report.memory.before.peak_bytes


def test_the_guard_judges_a_larger_setting_too(tmp_path):
    path = tmp_path / "bert.onnx"
    onnx.save(bert(14, False), path)
    report = api.optimize(path, FuseConfig(target="ort-cpu", dims={"batch": 2}), tmp_path / "o.onnx").report
    bound, larger = (dict(s) for s in report.peak_settings)
    assert bound["batch"] == 2 and bound["sequence"] == 1  # unbound: 1, as the estimate takes it
    assert larger == {name: max(value * LARGER, LARGER_AT_LEAST) for name, value in bound.items()}
    assert not api.optimize(path, FuseConfig(target="ort-cpu", allow_peak_growth=True), tmp_path / "a.onnx"
                            ).report.peak_settings


def test_the_cli_shows_the_guards_decision_in_the_table_and_json(tmp_path):
    path = tmp_path / "bert.onnx"
    onnx.save(bert(14, False), path)
    result = CliRunner().invoke(cli, ["optimize", str(path), "--target", "ort-cpu", "--dim", "batch=2",
                                      "--dim", "sequence=16", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "left out: +" in result.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["peak_guard"][0]["pass"] == "attention"


def test_the_peak_column_adds_up_to_the_total(tmp_path):
    report = api.optimize(SAMPLES / "transformer_block_opset14.onnx",
                          FuseConfig(target="ort-cpu", dims={"batch": 1, "sequence": 128}, verify=False),
                          dry_run=True).report
    audit = report.memory
    parts = sum(delta for _, _, delta in audit.peak_delta_by_pattern) + audit.peak_delta_other
    assert parts == audit.after.peak_bytes - audit.before.peak_bytes != 0
    assert len(audit.peak_delta_by_pattern) == len(report.rows()) >= 3


def test_the_larger_setting_computes_arithmetic_dims_from_the_grown_ones(tmp_path):
    # A decode step's mask is [batch, past_sequence + sequence]: at the larger setting it must be
    # past 64 + sequence 64 = 128 positions wide, as the Concat of past and new makes it, not 64.
    from onnx import TensorProto, helper
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past", "new"], ["keys"], axis=1),
         helper.make_node("Add", ["keys", "mask"], ["y"])], "decode",
        [helper.make_tensor_value_info("past", f, ["batch", "past_sequence"]),
         helper.make_tensor_value_info("new", f, ["batch", "sequence"]),
         helper.make_tensor_value_info("mask", f, ["batch", "past_sequence + sequence"])],
        [helper.make_tensor_value_info("y", f, ["batch", "past_sequence + sequence"])])
    path = tmp_path / "decode.onnx"
    onnx.save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), path)
    config = FuseConfig(dims={"batch": 2, "past_sequence": 3, "sequence": 5})
    bound, larger = (dict(s) for s in api.optimize(path, config, tmp_path / "o.onnx").report.peak_settings)
    assert bound["past_sequence + sequence"] == 8
    assert (larger["past_sequence"], larger["sequence"], larger["past_sequence + sequence"]) == (64, 64, 128)


def test_an_arithmetic_dim_only_the_outputs_declare_is_computed_never_assumed(tmp_path):
    """Whisper's decode step takes no mask: only its present K/V outputs declare
    `past_sequence + sequence`. Unbound, past and sequence are assumed 1 and the present is 2
    wide (it was once assumed 1 as a symbol of its own); at the larger setting 64 + 64."""
    from onnx import TensorProto, helper
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past", "new"], ["present"], axis=1),
         helper.make_node("Relu", ["new"], ["y"])], "decode",
        [helper.make_tensor_value_info("past", f, ["batch", "past_sequence", 4]),
         helper.make_tensor_value_info("new", f, ["batch", "sequence", 4])],
        [helper.make_tensor_value_info("y", f, ["batch", "sequence", 4]),
         helper.make_tensor_value_info("present", f, ["batch", "past_sequence + sequence", 4])])
    path = tmp_path / "decode.onnx"
    onnx.save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), path)
    report = api.optimize(path, FuseConfig(), tmp_path / "o.onnx").report
    bound, larger = (dict(s) for s in report.peak_settings)
    assert "past_sequence + sequence" not in report.unbound_dims
    assert set(report.unbound_dims) == {"batch", "past_sequence", "sequence"}
    assert bound["past_sequence + sequence"] == 2
    assert (larger["past_sequence"], larger["sequence"], larger["past_sequence + sequence"]) == (64, 64, 128)


def test_memory_audit_gives_a_kind_that_removes_nothing_new_no_part_of_the_peak():
    # The audit takes each fusion kind's removed intermediates away in turn; a kind whose tensors
    # are all gone already changes nothing: its part is 0 and the next kind's is measured from
    # the same peak, as walking the same absent set again would give.
    from fuse_cli.analysis.memory import profile_memory
    from fuse_cli.audit import PeakEstimate, memory_audit
    from fuse_cli.graph.io import load_model
    from fuse_cli.pipeline.records import FusionRecord, RemovedTensor
    from fuse_cli.shape_tables import build_shape_tables

    config = FuseConfig(dims={"batch": 2, "sequence": 64})
    loaded = load_model(SAMPLES / "transformer_block_opset17.onnx")
    tables = build_shape_tables(loaded.model, config)
    estimate = PeakEstimate(loaded, tables.bound, tables.planner, config)
    written = {name for node in loaded.model.graph.node for name in node.output}
    at_peak = [t.name for t in estimate.before.live_at_peak if t.name in written]  # largest first
    outputs = at_peak + sorted(written - set(at_peak))
    first, second = set(outputs[:2]), set(outputs[2:6])

    def record(pattern, names):
        return FusionRecord("p", pattern, (), (), tuple(RemovedTensor(n, None) for n in sorted(names)))

    audit = memory_audit(estimate, loaded.model, [record("a", first), record("again", set(outputs[1:2])),
                                                  record("b", second)], tables.bound)

    def peak(absent):
        return profile_memory(loaded.model, tables.bound, absent=absent, symbolic_shapes=tables.planner).peak_bytes

    before = estimate.before.peak_bytes
    assert audit.peak_delta_by_pattern == (
        ("p", "a", peak(first) - before), ("p", "again", 0), ("p", "b", peak(first | second) - peak(first)))
    assert audit.peak_delta_by_pattern[0][2] != 0


def _estimate_and_candidate(tmp_path, sample: str):
    from fuse_cli.audit import PeakEstimate
    from fuse_cli.graph.io import load_model
    from fuse_cli.shape_tables import build_shape_tables

    config = FuseConfig(dims={"batch": 2})
    api.optimize(SAMPLES / sample, config, tmp_path / "out.onnx")
    loaded = load_model(SAMPLES / sample)
    tables = build_shape_tables(loaded.model, config)
    return PeakEstimate(loaded, tables.bound, tables.planner, config), onnx.load(tmp_path / "out.onnx")


def _inferred_sizes(estimate, candidate, index: int) -> dict:
    from fuse_cli.audit import _fill_from, _infer

    setting = estimate.settings[index]
    table = _fill_from(_infer(candidate, setting.dims, setting.input_shapes), setting.shapes)
    return {name: table.nbytes(name) for name in table.tensors}


def test_a_candidates_sizes_come_without_an_inference_and_are_the_inferred_ones(tmp_path, monkeypatch):
    """The estimate sizes a candidate at each setting from the original's tables where the names
    it kept have their unbound shapes (the transformer: its Reshapes to [0, -1, ..] leave sequence
    dims that only an inference at the dims computes), or from its own unbound table at the dims
    (the CNN: named throughout). Either way: what inferring the candidate there gives."""
    from fuse_cli import audit

    for sample in ("transformer_block_opset17.onnx", "cnn_bn_relu.onnx"):
        estimate, candidate = _estimate_and_candidate(tmp_path, sample)
        inferred = [_inferred_sizes(estimate, candidate, i) for i in range(2)]
        calls = []
        monkeypatch.setattr(audit, "_infer", lambda *a: calls.append(a) or pytest.fail("inferred"))
        for index in range(2):
            sized = estimate._tables(candidate, index)[0]
            assert {name: sized.nbytes(name) for name in sized.tensors} == inferred[index], (sample, index)
        monkeypatch.undo()


def test_a_kept_name_whose_shape_changed_is_inferred_again(tmp_path, monkeypatch):
    """Must not carry over: a rewrite that left a name holding another shape (here the output of
    the first Reshape, made [0, 0, -1] of a [0, -1, h, d]) is sized by an inference."""
    from fuse_cli import audit
    from fuse_cli.audit import _kept_from

    estimate, candidate = _estimate_and_candidate(tmp_path, "transformer_block_opset17.onnx")
    planner = estimate._planner_shapes(candidate, *audit._structure(candidate)[1:])
    assert _kept_from(planner, estimate.symbolic, estimate.settings[0].shapes) is not None
    changed = onnx.ModelProto()
    changed.CopyFrom(candidate)
    candidate = changed
    reshape = next(n for n in candidate.graph.node if n.op_type == "Reshape")
    target = next(t for t in candidate.graph.initializer if t.name == reshape.input[1])
    target.CopyFrom(onnx.numpy_helper.from_array(np.array([0, 0, -1], np.int64), target.name))
    planner = estimate._planner_shapes(candidate, *audit._structure(candidate)[1:])
    assert _kept_from(planner, estimate.symbolic, estimate.settings[0].shapes) is None
    inferred = _inferred_sizes(estimate, candidate, 0)
    sized = estimate._tables(candidate, 0)[0]
    assert {name: sized.nbytes(name) for name in sized.tensors} == inferred
    assert len(sized.get(reshape.output[0]).shape) == 3


def _computed_rows(kind: str) -> onnx.ModelProto:
    """ConstantOfShape([f(N), 4096]) with f computed from x's batch N: Max(N, 3), or N rounded up
    to a multiple of 8. At the proof settings' primes (2 and 5, ...) Max(N, 3) is 3 and 5 and the
    round-up 8 and 8: sizes that name f N and 8 there, and nowhere else."""
    from onnx import TensorProto, helper, numpy_helper

    def ints(values, name):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Slice", ["shape", "zero", "one"], ["n"])]
    if kind == "max3":
        nodes.append(helper.make_node("Max", ["n", "three"], ["rows"]))
    else:
        nodes += [helper.make_node("Add", ["n", "seven"], ["n7"]), helper.make_node("Div", ["n7", "eight"], ["q"]),
                  helper.make_node("Mul", ["q", "eight"], ["rows"])]
    nodes += [helper.make_node("Concat", ["rows", "width"], ["target"], axis=0),
              helper.make_node("ConstantOfShape", ["target"], ["filled"],
                               value=numpy_helper.from_array(np.array([1], np.float32))),
              helper.make_node("ReduceSum", ["filled", "zero"], ["y"], keepdims=0)]
    graph = helper.make_graph(
        nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])],
        [ints([0], "zero"), ints([1], "one"), ints([3], "three"), ints([7], "seven"), ints([8], "eight"),
         ints([4096], "width")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_arithmetic_is_sized_by_inference_at_each_setting_never_by_the_proofs_names(tmp_path):
    """Found by an audit of a faster path that sized the bound and the larger setting from the
    proofs table: Max(N, 3) is 3 rows at N = 1 (the proofs name it N: 1 row), and the round-up
    64 rows at N = 64 (the proofs name it 8). The estimate's tables are onnx's inference at the
    dims, and so are the peaks the guard compares."""
    from fuse_cli.audit import PeakEstimate
    from fuse_cli.graph.io import load_model
    from fuse_cli.shape_tables import build_shape_tables

    for kind, rows in (("max3", (3, 64)), ("pad8", (8, 64))):
        path = tmp_path / f"{kind}.onnx"
        onnx.save(_computed_rows(kind), path)
        loaded = load_model(path)
        tables = build_shape_tables(loaded.model, FuseConfig())
        estimate = PeakEstimate(loaded, tables.bound, tables.planner, FuseConfig())
        assert [s.shapes.get("filled").shape for s in estimate.settings] == [(r, 4096) for r in rows], kind
        assert estimate.settings[1].before.peak_bytes >= rows[1] * 4096 * 4
        report = api.optimize(path, FuseConfig(verify=False), dry_run=True).report
        assert report.memory.before.peak_bytes >= rows[0] * 4096 * 4


def test_growth_within_the_tolerance_is_kept_and_the_tolerance_is_reported(tmp_path):
    """At batch 1 x sequence 1 the same attention fusion grows the estimated peak by 256 bytes:
    within max(0.5% of the original's peak, 4 KiB), so it is kept, and the report says how much
    the guard lets pass at each setting it judged."""
    path = tmp_path / "bert.onnx"
    onnx.save(bert(14, False), path)
    report = api.optimize(path, FuseConfig(target="ort-cpu"), tmp_path / "out.onnx").report
    assert not report.peak_guard
    grown = report.memory.after.peak_bytes - report.memory.before.peak_bytes
    assert 0 < grown <= PEAK_TOLERANCE_MIN_BYTES
    assert op_counts(onnx.load(tmp_path / "out.onnx"))["com.microsoft::Attention"] == 1
    assert len(report.peak_tolerances) == len(report.peak_settings) == 2
    assert report.peak_tolerances[0] == max(PEAK_TOLERANCE_MIN_BYTES, int(report.memory.before.peak_bytes * 0.005))
    result = CliRunner().invoke(cli, ["optimize", str(path), "--target", "ort-cpu", "-o", str(tmp_path / "o2.onnx"),
                                      "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r.json").read_text())["peak_guard_tolerance_bytes"] == list(report.peak_tolerances)
