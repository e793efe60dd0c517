"""The ways verification was fooled once, each kept as a test (issue: "Verification that cannot be
fooled"): merged symbolic names taken as proofs, an optimized model that does not run, the
original that cannot run, all-NaN outputs, one huge value loosening the tolerance, integer inputs
out of an embedding's range."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from click.testing import CliRunner
from onnx import TensorProto

from fuse_cli import api
from fuse_cli.analysis.shapes import infer_shapes, with_runtime_dims
from fuse_cli.cli import cli
from fuse_cli.config import FuseConfig
from fuse_cli.graph.edit import Replacement
from fuse_cli.input_domain import integer_ranges, shape_settings
from fuse_cli.match import Op, Var
from fuse_cli.passes import REGISTRY
from fuse_cli.pipeline.base import PatternPass
from fuse_cli.verify import compare_outputs, verify_models
from tests.graphs import GraphBuilder, op_counts


def shape_confusing_model() -> onnx.ModelProto:
    """z = x[N, 4] + y[M, 4]; Reshape(z, [N, -1]): valid for N = M, or N = 1 (z is [M, 4], out [1, 4M])."""
    b = GraphBuilder()
    x, y = b.input("x", ["N", 4]), b.input("y", ["M", 4])
    z = b.op("Add", x, y)
    n = b.op("Slice", b.op("Shape", x), b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)))
    shape = b.op("Concat", n, b.const(np.array([-1], np.int64)), axis=0)
    return b.build(b.op("Reshape", z, shape), output_names=["out"])


# ------------------------------------------------------------------ 1. merged names prove nothing

def test_onnxruntime_merged_dims_are_no_proof_for_fusion_checks():
    model = shape_confusing_model()
    table = with_runtime_dims(model, infer_shapes(model), proofs=True)
    add_out = next(n.output[0] for n in model.graph.node if n.op_type == "Add")
    assert table.get(add_out).shape == (None, 4), "N or M by hash seed: neither is provable"
    assert with_runtime_dims(model, infer_shapes(model)).get(add_out).shape[0] in ("N", "M")


def test_a_computed_dim_is_named_after_the_arithmetic_the_graph_declares():
    """A decode step with no mask input (Whisper's): a mask of the cache's length, built from Shape
    arithmetic, takes `past_sequence + sequence`'s sizes at both proof settings; the name is declared
    only on the present output, and the proofs table names the mask's dim after it (the attentions
    then prove the mask [.., sequence, key length])."""
    b = GraphBuilder()
    x, past = b.input("x", ["batch", "sequence", 4]), b.input("past", ["batch", "past_sequence", 4])
    present = b.op("Concat", past, x, axis=1)

    def length_of(t: str) -> str:
        return b.op("Gather", b.op("Shape", t), b.const(np.array(1, np.int64)), axis=0)

    total = b.op("Add", length_of(past), length_of(x))
    # [T]: onnx cannot say T
    positions = b.op("Range", b.const(np.array(0, np.int64)), total, b.const(np.array(1, np.int64)))
    mask = b.op("Cast", b.op("Unsqueeze", positions, b.const(np.array([0, 1], np.int64))), to=TensorProto.FLOAT)
    y = b.op("Add", mask, b.const(np.float32(0)))
    model = b.build(present, y, output_names=["present", "y"])
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("present", TensorProto.FLOAT,
                                                                      ["batch", "past_sequence + sequence", 4]))
    table = with_runtime_dims(model, infer_shapes(model), proofs=True)
    assert table.get(mask).shape == (1, 1, "past_sequence + sequence"), table.get(mask)


@pytest.mark.parametrize("hash_seed", ["1", "2", "3"])
def test_the_shape_confusing_reshape_is_kept_whatever_the_hash_seed(tmp_path, hash_seed):
    path, out = tmp_path / "m.onnx", tmp_path / "m.out.onnx"
    onnx.save(shape_confusing_model(), path)
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-m", "fuse_cli", "optimize", str(path), "-o", str(out), "--json", "-"],
                          capture_output=True, text=True, env=env, check=False)
    report = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert report["nodes"]["after"] == 5 and not report["rolled_back"]
    assert report["verification"]["status"] == "match"
    ones = [s for s in report["verification"]["settings"] if s["N"] == 1 or s["M"] == 1]
    assert ones and all(s["N"] != s["M"] for s in report["verification"]["settings"])
    feeds = {"x": np.ones((1, 4), np.float32), "y": np.ones((3, 4), np.float32)}
    assert verify_models(str(path), str(out), feeds=feeds).passed


class ReshapeToFirstDim(PatternPass):
    """Test-only: the rewrite the merged name once licensed, Reshape(z, [0, -1]) (0 copies z's dim 0)."""

    name = "test-reshape-copies-dim-0"
    description = "Broken on purpose: takes two symbols for one"
    label = "Reshape(Shape(x)[0], -1) -> Reshape(0, -1)"
    pattern = Op("Reshape", Var("z"), Op("Concat", Var("n"), Var("rest"), name="concat"), name="reshape")

    def rewrite(self, m, g) -> Replacement:
        reshape = m.node("reshape")
        shape = g.constant("copied_shape", np.array([0, -1], np.int64))
        return Replacement(nodes=[gs.Node(op="Reshape", name=reshape.name, inputs=[m.tensor("z"), shape],
                                          outputs=[reshape.outputs[0]])])


def test_distinct_sizes_catch_a_rewrite_that_confuses_two_symbols(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, ReshapeToFirstDim.name, ReshapeToFirstDim())
    path = tmp_path / "m.onnx"
    onnx.save(shape_confusing_model(), path)
    report = api.optimize(path, FuseConfig(passes=(ReshapeToFirstDim.name,)), tmp_path / "o.onnx").report
    assert [r.pass_name for r in report.rolled_back] == [ReshapeToFirstDim.name]
    assert "where the original gives" in report.rolled_back[0].reason and report.exit_code == 1


def test_settings_never_bind_two_symbols_to_one_size_nor_a_symbol_to_a_static_dim():
    b = GraphBuilder()
    model = b.build(b.op("Add", b.input("a", ["batch", 3, "h"]), b.input("b", ["batch", 3, "w"])), output_names=["y"])
    for candidate in shape_settings(model):
        for setting in candidate:
            free = [v for k, v in setting.items() if v != 1]
            assert len(set(free)) == len(free) and 3 not in free and 2 not in free
    first, second = shape_settings(model)[0]
    assert all(first[k] != second[k] for k in first)


def test_dims_written_as_arithmetic_of_symbols_are_computed():
    b = GraphBuilder()
    past = b.input("past", ["batch", "past_sequence", 4])
    mask = b.input("mask", ["batch", "past_sequence + sequence"])  # as torch's dynamo exporter names dims
    new = b.input("new", ["batch", "sequence", 4])
    kv = b.op("Concat", past, new, axis=1)  # [batch, past_sequence + sequence, 4]
    masked = b.op("Mul", kv, b.op("Unsqueeze", mask, b.const(np.array([2], np.int64))))  # runs only if sizes agree
    model = b.build(masked, output_names=["kv"])
    (setting, _), *_ = shape_settings(model)
    assert setting["past_sequence + sequence"] == setting["past_sequence"] + setting["sequence"]
    assert verify_models(model, model).passed


def _rows_rounded_up_to_8() -> onnx.ModelProto:
    """x [N, 16] padded with zero rows up to a multiple of 8, times its own row count: the count
    is 8 at the proof settings N = 3 and N = 5, and 16 at N = 9."""
    b = GraphBuilder()
    x = b.input("x", ["N", 16])
    zero, one, eight = (b.const(np.array([v], np.int64)) for v in (0, 1, 8))
    n = b.op("Slice", b.op("Shape", x), zero, one)
    rows = b.op("Mul", b.op("Div", b.op("Add", n, b.const(np.array([7], np.int64))), eight), eight)
    pads = b.op("Concat", zero, zero, b.op("Sub", rows, n), zero, axis=0)
    padded = b.op("Pad", x, pads)
    count = b.op("Cast", b.op("Slice", b.op("Shape", padded), zero, one), to=TensorProto.FLOAT)
    return b.build(b.op("Mul", b.op("Relu", padded), count), output_names=["y"])


def test_a_size_two_settings_share_is_no_constant(tmp_path):
    """Found this session: the proofs table named a dim by its one size at both settings, as a
    number, and static-shape-dims folded the padded row count to 8: verification at N = 3 and
    N = 5 agreed, and the output was wrong from N = 9 on (8 where 16). A number now only where a
    third setting far from both keeps it (the 16 columns); the rows are named, nothing folds them."""
    model = _rows_rounded_up_to_8()
    path, out = tmp_path / "pad.onnx", tmp_path / "out.onnx"
    onnx.save(model, path)
    table = with_runtime_dims(model, infer_shapes(model), proofs=True)
    padded = next(n.output[0] for n in model.graph.node if n.op_type == "Pad")
    assert isinstance(table.get(padded).shape[0], str) and table.get(padded).shape[1] == 16
    report = api.optimize(path, FuseConfig(verify=True), out).report
    assert report.verification.passed
    for rows in (1, 9, 17):
        assert verify_models(str(path), str(out), feeds={"x": np.ones((rows, 16), np.float32)}).passed, rows


# ------------------------------------------- 2/3. an optimized model that fails is a mismatch

class DropsEveryFlatten(PatternPass):
    """Test-only: eliminate-flatten without its check, the Flatten(axis=2) bug."""

    name = "test-drop-flatten"
    description = "Broken on purpose: removes Flatten before Gemm whatever its axis"
    label = "Flatten + Gemm"
    pattern = Op("Gemm", Op("Flatten", Var("x"), name="flatten"), Var("b"), name="gemm")

    def rewrite(self, m, g) -> Replacement:
        gemm = m.node("gemm")
        return Replacement(nodes=[gs.Node(op="Gemm", name=gemm.name, attrs=dict(gemm.attrs),
                                          inputs=[m.tensor("x"), m.tensor("b")], outputs=list(gemm.outputs))])


def flatten_axis_2_model() -> onnx.ModelProto:
    b = GraphBuilder()
    flat = b.op("Flatten", b.op("Abs", b.input("x", [1, 5])), axis=2)  # [5, 1]
    return b.build(b.op("Gemm", flat, b.const(b.rand(1, 3))), output_names=["y"])


def test_an_optimized_model_that_onnxruntime_refuses_is_rolled_back(tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, DropsEveryFlatten.name, DropsEveryFlatten())
    path = tmp_path / "m.onnx"
    onnx.save(flatten_axis_2_model(), path)
    out = tmp_path / "o.onnx"
    report = api.optimize(path, FuseConfig(passes=("eliminate-identity", DropsEveryFlatten.name)), out).report
    (rolled,) = report.rolled_back
    assert rolled.pass_name == DropsEveryFlatten.name and rolled.output is None
    assert "where the original runs" in rolled.reason and report.exit_code == 1
    assert report.verification.passed and op_counts(onnx.load(out))["Flatten"] == 1


def test_the_real_eliminate_flatten_keeps_axis_2(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(flatten_axis_2_model(), path)
    report = api.optimize(path, FuseConfig(), tmp_path / "o.onnx").report
    assert report.exit_code == 0 and report.verification.passed and not report.rolled_back
    assert op_counts(onnx.load(tmp_path / "o.onnx"))["Flatten"] == 1


def unrunnable_original() -> onnx.ModelProto:
    """Runs nowhere: Gather indices from a 2-row table, fed out of range through --int-range."""
    b = GraphBuilder()
    ids = b.input("token_type_ids", ["batch", "sequence"], dtype=TensorProto.INT64)
    emb = b.op("Gather", b.const(b.rand(2, 4)), ids)
    return b.build(b.op("Relu", b.op("Identity", emb)), output_names=["y"])


def test_an_original_that_cannot_run_is_unverifiable_and_says_so(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(unrunnable_original(), path)
    config = FuseConfig(int_ranges={"token_type_ids": (5, 9)})
    report = api.optimize(path, config, tmp_path / "o.onnx").report
    assert report.verification.status == "unverifiable" and report.exit_code == 0
    assert report.verification.reason.startswith("the original model cannot run")
    strict = api.optimize(path, FuseConfig(int_ranges=config.int_ranges, require_verified=True), tmp_path / "s.onnx")
    assert strict.report.exit_code == 1 and strict.report.failures[0].startswith("--require-verified")


def test_the_cli_says_unverifiable_once_without_onnxruntimes_log(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(unrunnable_original(), path)
    done = subprocess.run([sys.executable, "-m", "fuse_cli", "optimize", str(path), "-o", str(tmp_path / "o.onnx"),
                           "--int-range", "token_type_ids=5:9", "--require-verified"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "UNVERIFIABLE: the original model cannot run" in done.stdout + done.stderr
    assert "onnxruntime:" not in done.stderr.replace("onnxruntime: ", ""), done.stderr


def test_batch_mode_shows_an_unverifiable_model(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    onnx.save(unrunnable_original(), folder / "bad.onnx")
    result = CliRunner().invoke(cli, ["optimize", str(folder), "--out-dir", str(tmp_path),
                                      "--int-range", "token_type_ids=5:9", "--json", "-"])
    record = json.loads(result.stdout[result.stdout.index("{"):])["models"][0]
    assert record["report"]["verification"]["status"] == "unverifiable"
    assert "unverifiable" in result.stderr


# --------------------------------------------------------------------------- 4. non-finite

def test_all_nan_outputs_are_inconclusive_not_a_match(tmp_path):
    b = GraphBuilder()
    y = b.op("Sqrt", b.op("Sub", b.op("Neg", b.op("Abs", b.input("x", ["batch", 8]))), b.const(np.float32(1))))
    original = b.build(y, output_names=["y"])  # sqrt(-|x| - 1): NaN everywhere
    b = GraphBuilder()
    y = b.op("Sqrt", b.op("Sub", b.op("Neg", b.op("Abs", b.input("x", ["batch", 8]))), b.const(np.float32(1))))
    other = b.build(b.op("Mul", y, b.const(np.float32(-7))), output_names=["y"])  # -7 * y
    for path, model in (("a.onnx", original), ("b.onnx", other)):
        onnx.save(model, tmp_path / path)
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--json", "-"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout[result.stdout.index("{"):])
    assert payload["status"] == "inconclusive" and payload["outputs"][0]["all_nonfinite"]


def test_nan_positions_must_agree_and_statistics_are_over_finite_elements():
    want = {"y": np.array([np.nan, 1.0, 2.0], np.float32)}
    moved = {"y": np.array([1.0, np.nan, 2.0], np.float32)}
    result = compare_outputs(want, moved)
    assert result.status == "mismatch" and result.outputs[0].nonfinite_mismatches == 2
    same = compare_outputs(want, {"y": np.array([np.nan, 1.0, 2.0 + 1e-7], np.float32)})
    assert same.passed and np.isfinite(same.outputs[0].max_abs_diff)


# ------------------------------------------------------------------- 5. one large value

def test_one_mask_fill_does_not_loosen_the_tolerance_of_the_rest():
    rng = np.random.default_rng(0)
    want = rng.standard_normal((2, 64)).astype(np.float32)
    want[0, 0] = -1e6  # a typical mask fill
    wrong = want.copy()
    wrong[:, ::2] += 5  # every other element off by 5
    wrong[0, 0] = want[0, 0]
    assert not compare_outputs({"y": want}, {"y": wrong}).passed
    rounding = want + np.float32(2e-6) * np.sign(want)
    assert compare_outputs({"y": want}, {"y": rounding}).passed


# ---------------------------------------------------------- 6. integer inputs from the graph

def bert_like_embeddings() -> onnx.ModelProto:
    """word + token type (2 rows) + position (through Add of a constant offset) embeddings, masked."""
    b = GraphBuilder()
    ids = b.input("input_ids", ["batch", "sequence"], dtype=TensorProto.INT64)
    types = b.input("token_type_ids", ["batch", "sequence"], dtype=TensorProto.INT64)
    positions = b.input("position_ids", ["batch", "sequence"], dtype=TensorProto.INT64)
    mask = b.input("attention_mask", ["batch", "sequence"], dtype=TensorProto.INT64)
    words = b.op("Gather", b.const(b.rand(1000, 8)), ids)
    kinds = b.op("Gather", b.const(b.rand(2, 8)), b.op("Cast", types, to=TensorProto.INT64))
    where = b.op("Gather", b.const(b.rand(64, 8)), b.op("Add", positions, b.const(np.int64(2), dtype=np.int64)))
    emb = b.op("Add", b.op("Add", words, kinds), where)
    keep = b.op("Unsqueeze", b.op("Cast", mask, to=TensorProto.FLOAT), b.const(np.array([2], np.int64)))
    fill = b.op("Mul", b.op("Sub", b.const(np.float32(1)), keep), b.const(np.float32(np.finfo(np.float32).min)))
    return b.build(b.op("Softmax", b.op("Add", emb, fill), axis=-1), output_names=["y"])


def test_integer_inputs_take_the_ranges_the_graph_implies():
    ranges = integer_ranges(bert_like_embeddings())
    assert ranges == {"input_ids": (0, 1000), "token_type_ids": (0, 2), "position_ids": (0, 62),
                      "attention_mask": (0, 2)}


def test_a_bert_style_export_verifies_with_default_flags(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(bert_like_embeddings(), path)
    report = api.optimize(path, FuseConfig(), tmp_path / "o.onnx").report
    assert report.verification.status == "match", report.verification.reason
