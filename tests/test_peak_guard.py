"""The peak guard: fuse never writes a model whose estimated peak activation memory exceeds the
original's (at the bound dims and at a larger setting), unless --allow-peak-growth; the passes it
leaves out are named with the reason, and the savings table's peak column adds up."""

from __future__ import annotations

import json

import onnx
from click.testing import CliRunner

from fuse_cli import api
from fuse_cli.audit import LARGER, LARGER_AT_LEAST
from fuse_cli.cli import cli
from fuse_cli.config import FuseConfig
from tests.attention_graphs import bert
from tests.conftest import SAMPLES
from tests.graphs import op_counts

MHA = "com.microsoft::MultiHeadAttention"


def test_a_fusion_that_raises_the_estimated_peak_is_left_out_and_said_why(tmp_path):
    """A small BERT layer: MultiHeadAttention's head-major Q/K/V copies outweigh what it removes."""
    path = tmp_path / "bert.onnx"
    onnx.save(bert(14, False), path)
    report = api.optimize(path, FuseConfig(target="ort-cpu"), tmp_path / "out.onnx").report
    (decline,) = report.peak_guard
    assert decline.pass_name == "attention" and all(g.after_bytes > g.before_bytes for g in decline.growth)
    (miss,) = [m for m in report.near_misses if m.pass_name == "attention"]
    assert miss.reason.startswith("raises the estimated peak activation memory by") and "--allow-peak-growth" in miss.reason
    written = onnx.load(tmp_path / "out.onnx")
    assert MHA not in op_counts(written)
    assert report.memory.after.peak_bytes <= report.memory.before.peak_bytes
    assert report.exit_code == 0 and report.verification.passed

    allowed = api.optimize(path, FuseConfig(target="ort-cpu", allow_peak_growth=True), tmp_path / "allowed.onnx")
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
    result = CliRunner().invoke(cli, ["optimize", str(path), "--target", "ort-cpu", "--json", str(tmp_path / "r.json")])
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
