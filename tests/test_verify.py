"""Self-checking: verification statistics, input sources, and bisect + rollback of a bad pass."""

import json
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, numpy_helper

from fuse_cli import api
from fuse_cli.cli import cli
from fuse_cli.config import FuseConfig
from fuse_cli.graph.edit import Replacement
from fuse_cli.passes import REGISTRY
from fuse_cli.passes.conv_bn import FoldBatchNormIntoConv
from fuse_cli.input_domain import shape_settings
from fuse_cli.verify import (compare_with_reference, load_inputs, make_session, random_inputs, reference_for,
                             verify_models)
from tests.graphs import GraphBuilder, op_counts


def conv_bn_model(tiny_var: bool = True) -> onnx.ModelProto:
    """Conv -> BN -> Relu where eps matters: variance ~1e-4 next to eps 1e-3."""
    b = GraphBuilder()
    x = b.input("x", ["batch", 3, 8, 8])
    c = b.op("Conv", x, b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1], name="conv")
    var = b.rand(4, low=1e-4, high=2e-4) if tiny_var else b.rand(4, low=0.5, high=1.5)
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)), b.const(b.rand(4)),
             b.const(var), epsilon=1e-3, name="bn")
    return b.build(b.op("Relu", y), output_names=["y"])


class DropsEpsilon(FoldBatchNormIntoConv):
    """Test-only: the classic accuracy bug, a Conv+BN fold that forgets eps."""

    name = "test-conv-bn-without-eps"
    description = "Broken on purpose: folds BatchNormalization ignoring epsilon"

    def rewrite(self, m, g) -> Replacement:
        m.node("bn").attrs["epsilon"] = 0.0
        return super().rewrite(m, g)


@pytest.fixture
def broken_pass(monkeypatch):
    monkeypatch.setitem(REGISTRY, DropsEpsilon.name, DropsEpsilon())
    return DropsEpsilon.name


def test_a_pass_that_drops_eps_is_caught_bisected_and_rolled_back(tmp_path, broken_pass):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(), path)
    out = tmp_path / "m.out.onnx"
    config = FuseConfig(passes=("fold-constants", "eliminate-identity", broken_pass), verify=True)
    report = api.optimize(path, config, out).report
    assert [r.pass_name for r in report.rolled_back] == [broken_pass]
    assert report.rolled_back[0].output == "y" and report.rolled_back[0].max_abs_diff > 1e-2
    assert report.exit_code == 1 and "rolled back" in report.failures[0]
    written = onnx.load(out)
    assert op_counts(written)["BatchNormalization"] == 1, "the broken pass's rewrite must not be in the output"
    assert verify_models(str(path), written).passed
    allowed = api.optimize(path, FuseConfig(passes=config.passes, verify=True, allow_mismatch=True), out).report
    assert allowed.exit_code == 0 and allowed.rolled_back


def test_cli_exits_1_and_names_the_pass(tmp_path, broken_pass):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(), path)
    result = CliRunner().invoke(cli, ["optimize", str(path), "--passes", f"fold-constants,{broken_pass}",
                                      "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["rolled_back"][0]["pass_name"] == broken_pass and data["exit_code"] == 1
    assert data["verification"]["passed"] is True  # the model written without the broken rewrites


def test_a_correct_pass_verifies_with_statistics(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(), path)
    report = api.optimize(path, FuseConfig(verify=True), tmp_path / "o.onnx").report
    assert report.exit_code == 0 and not report.rolled_back
    (out,) = report.verification.outputs
    assert out.passed and out.max_abs_diff < 1e-4 and out.cosine_similarity > 0.999999


def test_verify_command_fails_on_a_real_difference(tmp_path):
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(conv_bn_model(), good)
    changed = conv_bn_model()
    for init in changed.graph.initializer:
        if init.dims == [4, 3, 3, 3]:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.01, init.name))
    onnx.save(changed, bad)
    result = CliRunner().invoke(cli, ["verify", str(good), str(bad), "--json", "-"])
    assert result.exit_code == 1
    same = CliRunner().invoke(cli, ["verify", str(good), str(good), "--dim", "batch=3", "--json", "-"])
    assert same.exit_code == 0
    payload = json.loads(same.stdout[same.stdout.index("{"):])
    assert payload["passed"] and payload["outputs"][0]["shape"] == [3, 4, 8, 8]


def test_int_inputs_respect_ranges():
    b = GraphBuilder()
    ids = b.input("input_ids", ["batch", 16], dtype=TensorProto.INT64)
    table = b.const(b.rand(100, 4))
    model = b.build(b.op("Gather", table, ids), output_names=["emb"])
    session = make_session(model)
    feeds = random_inputs(session, dims={"batch": 64}, int_ranges={"input_ids": (90, 100)})
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].shape == (64, 16)
    assert feeds["input_ids"].min() >= 90 and feeds["input_ids"].max() < 100


def test_npz_and_pb_inputs_load(tmp_path):
    x = np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8) / 100
    np.savez(tmp_path / "in.npz", x=x)
    assert np.array_equal(load_inputs(tmp_path / "in.npz")["x"], x)
    folder = tmp_path / "pb"
    folder.mkdir()
    (folder / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    assert np.array_equal(load_inputs(folder)["x"], x)
    model_path = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(), model_path)
    result = CliRunner().invoke(cli, ["verify", str(model_path), str(model_path), "--inputs", str(folder)])
    assert result.exit_code == 0, result.output


def test_default_atol_scales_with_the_outputs_magnitude():
    from fuse_cli.verify import compare_outputs

    want = {"logits": np.array([10.0, -8.0, 0.001], np.float32)}
    rounding = {"logits": np.array([10.0, -8.0, 0.001 + 4e-5], np.float32)}  # a deep sum's rounding near 0
    wrong = {"logits": np.array([10.0, -8.0, 0.001 + 4e-3], np.float32)}  # a real error
    assert compare_outputs(want, rounding).passed
    assert not compare_outputs(want, wrong).passed
    assert not compare_outputs(want, rounding, rtol=1e-4, atol=1e-5).passed  # an explicit atol is absolute


def test_nan_and_inf_where_the_original_has_them_are_agreement():
    from fuse_cli.verify import compare_outputs

    want = {"y": np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)}
    assert compare_outputs(want, {"y": want["y"].copy()}).passed
    assert not compare_outputs(want, {"y": np.array([0.0, np.inf, -np.inf, 1.0], np.float32)}).passed
    assert not compare_outputs(want, {"y": np.array([np.nan, -np.inf, -np.inf, 1.0], np.float32)}).passed


def test_mask_inputs_get_zeros_and_ones_so_the_original_stays_finite():
    """(1 - mask) * finfo.min, as BERT exports write it, overflows to -inf for mask values >= 2."""
    b = GraphBuilder()
    scores = b.input("scores", ["batch", 8])
    mask = b.input("attention_mask", ["batch", 8], dtype=TensorProto.INT64)
    inverted = b.op("Sub", b.const(np.float32(1.0)), b.op("Cast", mask, to=TensorProto.FLOAT))
    bias = b.op("Mul", inverted, b.const(np.float32(np.finfo(np.float32).min)))
    model = b.build(b.op("Softmax", b.op("Add", scores, bias), axis=-1), output_names=["probs"])
    feeds = random_inputs(make_session(model), dims={"batch": 16})
    assert set(np.unique(feeds["attention_mask"])) <= {0, 1}
    assert verify_models(model, model, dims={"batch": 16}).passed


def two_input_model() -> onnx.ModelProto:
    b = GraphBuilder()
    x = b.input("x", ["batch", "width"])
    y = b.input("y", ["batch", 1])
    return b.build(b.op("Add", x, y), output_names=["z"])


def test_distinct_symbols_get_distinct_sizes_at_two_settings_and_bound_ones_stay():
    (first, second), *_ = shape_settings(two_input_model(), {"width": 5})
    assert first["width"] == second["width"] == 5
    assert first["batch"] not in (1, 2, 5) and second["batch"] not in (1, 2, 5, first["batch"])


def test_sessions_are_built_with_the_pinned_dims(monkeypatch):
    """onnxruntime's session creation is quadratic in node count while inputs have free dims, so
    verification fixes them at the values its random inputs take. (The worker process's runs are
    made here, where the spy sees them.)"""
    from fuse_cli.core import isolation, model_runs

    model = two_input_model()
    seen = []
    real = model_runs.session_for_verification

    def spy(m, **kwargs):
        session = real(m, **kwargs)
        seen.append([i.shape for i in session.get_inputs()])
        return session

    monkeypatch.setattr(model_runs, "session_for_verification", spy)
    monkeypatch.setattr(isolation, "call", lambda function, *args, **kwargs: function(*args, **kwargs))
    result = verify_models(model, model, dims={"batch": 3})
    assert result.passed
    widths = [dict(s)["width"] for s in result.settings]
    assert seen == [[[3, w], [3, 1]] for _ in ("original", "optimized") for w in widths]
    assert len(set(widths)) == 2
    seen.clear()
    feeds = {"x": np.ones((4, 6), np.float32), "y": np.ones((4, 1), np.float32)}
    assert verify_models(model, model, dims={"batch": 3}, feeds=feeds).passed, "given inputs keep their own shapes"
    assert seen == [[["batch", "width"], ["batch", 1]]] * 2


# ---------------------------------------------- the original's runs beside the pipeline (issue 18)

@pytest.mark.parametrize("limit", [0, 2**40], ids=["one-at-a-time", "beside-the-pipeline"])
def test_the_broken_pass_is_rolled_back_whether_the_runs_go_at_once_or_one_at_a_time(
        tmp_path, broken_pass, monkeypatch, limit):
    """The weight limit picks the order (promises.CONCURRENT_WEIGHT_LIMIT); the verdict, the
    statistics and the rollback are the same either way."""
    from fuse_cli import promises
    monkeypatch.setattr(promises, "CONCURRENT_WEIGHT_LIMIT", limit)
    path, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(conv_bn_model(), path)
    config = FuseConfig(passes=("fold-constants", broken_pass), verify=True)
    report = api.optimize(path, config, out).report
    assert [r.pass_name for r in report.rolled_back] == [broken_pass]
    assert report.verification.passed and len(report.verification.settings) == 2
    sequential = compare_with_reference(reference_for(str(path), onnx.load(path)), onnx.load(out))
    assert report.verification.outputs == sequential.outputs


def test_a_candidates_settings_run_at_once_give_the_verdicts_of_one_at_a_time(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_model(), path)
    reference = reference_for(str(path), onnx.load(path))
    assert len(reference.runs) == 2
    changed = conv_bn_model()
    for init in changed.graph.initializer:
        if init.dims == [4, 3, 3, 3]:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.01, init.name))
    broken = conv_bn_model()
    broken.graph.node[0].op_type = "NoSuchOp"
    for candidate, status in ((conv_bn_model(), "match"), (changed, "mismatch"), (broken, "mismatch")):
        one_at_a_time = compare_with_reference(reference, candidate)
        at_once = compare_with_reference(reference, candidate, concurrent=True)
        assert one_at_a_time.status == at_once.status == status
        assert one_at_a_time == at_once
    assert "fails at" in compare_with_reference(reference, broken, concurrent=True).reason


def test_the_original_is_read_beside_the_pipeline_by_its_absolute_path(tmp_path, monkeypatch):
    """Found by an audit: the main thread's shape inference works in a scratch folder for a moment
    (onnxruntime's symbolic inference writes files into the working directory), so a relative
    path the worker read then was looked up there: FileNotFoundError, or an original whose
    external data was missing (unverifiable, the output written unverified)."""
    from fuse_cli import promises

    read = []
    real = promises.read_original
    monkeypatch.setattr(promises, "read_original", lambda path: read.append(path) or real(path))
    onnx.save(conv_bn_model(), tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    report = api.optimize("m.onnx", FuseConfig(verify=True), "o.onnx").report
    assert report.verification.passed
    (path,) = read
    assert os.path.isabs(path) and os.path.samefile(path, tmp_path / "m.onnx")
