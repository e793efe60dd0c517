"""Settings verification can run: sizes derived from the model where the distinct primes fail on
the original (an FPN's Concat, a 512-sample window, a Conv1d's 400-sample kernel), the one
binding of --dim and --input-shape (per position for '?', -1 and unnamed dims) that the estimate,
verification and --measure share, and both values of a bool input that selects an If's branch."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fuse_cli import api
from fuse_cli.analysis.measure import concrete_input_shapes, measure_peak
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.config import FuseConfig
from fuse_cli.errors import UsageError
from fuse_cli.input_domain import binding, branch_inputs, derived_settings, input_dim_keys
from fuse_cli.verify import MATCH, MISMATCH, reference_for, reference_plan, verify_models
from tests.graphs import GraphBuilder


def conv(b, x, cin, cout, **attrs):
    return b.op("Relu",
                b.op("Conv", x, b.const(b.rand(cout, cin, 3, 3)), b.const(b.rand(cout)), pads=[1, 1, 1, 1], **attrs))


def batchnorm(b, x, channels):
    return b.op("BatchNormalization", x, b.const(b.rand(channels, low=0.5)), b.const(b.rand(channels)),
                b.const(b.rand(channels)), b.const(b.rand(channels, low=0.5, high=1.5)))


def fpn(bias_shift: float = 0.0) -> onnx.ModelProto:
    """Two stride-2 Convs, an x2 upsample, a Concat with the skip: at odd sizes the upsampled map is
    one row short of the skip and onnxruntime cannot merge the Concat's shapes."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 3, "height", "width"])
    c1 = conv(b, x, 3, 4, strides=[2, 2])
    c2 = b.op("Conv", c1, b.const(b.rand(8, 4, 3, 3)), b.const(b.rand(8) + bias_shift), pads=[1, 1, 1, 1],
              strides=[2, 2])
    up = b.op("Resize", batchnorm(b, c2, 8), "", b.const(np.array([1, 1, 2, 2], np.float32)), mode="nearest")
    return b.build(b.op("Concat", up, c1, axis=1), output_names=["y"])


def window() -> onnx.ModelProto:
    """[batch, samples] framed as Reshape(-1, 512): the samples must be a multiple of 512."""
    b = GraphBuilder(opset=17)
    frames = b.op("Reshape", b.input("audio", ["batch", "samples"]), b.const(np.array([-1, 512], np.int64)))
    y = b.op("Mul", b.op("MatMul", frames, b.const(b.rand(512, 16))), b.const(np.float32(0.5)))
    return b.build(b.op("Add", y, b.const(b.rand(16))), output_names=["y"])


def mono_window() -> onnx.ModelProto:
    """A bare [samples] signal framed as Reshape(-1, 512)."""
    b = GraphBuilder(opset=17)
    frames = b.op("Reshape", b.input("audio", ["samples"]), b.const(np.array([-1, 512], np.int64)))
    return b.build(b.op("MatMul", frames, b.const(b.rand(512, 4))), output_names=["y"])


def conv1d() -> onnx.ModelProto:
    """A Conv1d front end, kernel 400 and stride 160 over the samples: shorter signals cannot run."""
    b = GraphBuilder(opset=17)
    x = b.op("Unsqueeze", b.input("audio", ["batch", "samples"]), b.const(np.array([1], np.int64)))
    c = b.op("Conv", x, b.const(b.rand(8, 1, 400)), b.const(b.rand(8)), strides=[160])
    return b.build(batchnorm(b, c, 8), output_names=["y"])


def optimize(tmp_path, model, **config):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return api.optimize(path, FuseConfig(**config), tmp_path / "out.onnx").report


@pytest.mark.parametrize("build, stride_or_window", [(fpn, 4), (window, 512), (mono_window, 512), (conv1d, 160)])
def test_models_the_primes_cannot_run_verify_match_at_settings_derived_from_them(tmp_path, build, stride_or_window):
    report = optimize(tmp_path, build())
    result = report.verification
    assert result.status == MATCH, result.reason
    assert len(result.settings) == 2
    first, second = (dict(s) for s in result.settings)
    assert all(first[k] != second[k] for k in first), "two settings that differ in every free dim"
    extents = [k for k in first if k != "batch"]
    assert all(s[k] % stride_or_window == 0 for s in (first, second) for k in extents)
    assert "the distinct primes fail on the original; settings derived from the model" in result.settings_note
    assert str(stride_or_window) in result.settings_note
    assert report.exit_code == 0


def test_a_broken_candidate_is_caught_at_the_derived_settings():
    result = verify_models(fpn(), fpn(bias_shift=1e-2))
    assert result.status == MISMATCH
    assert "total stride 4" in result.settings_note


def test_only_one_derived_setting_is_said_so():
    """A model that accepts 512 samples only: one setting, and the report says so."""
    b = GraphBuilder(opset=17)
    x = b.input("audio", [1, "samples"])
    y = b.op("MatMul", x, b.const(b.rand(512, 4)))
    model = b.build(y, output_names=["y"])
    result = verify_models(model, model)
    assert result.status == MATCH
    assert [dict(s) for s in result.settings] == [{"samples": 512}]
    assert "only one setting derived from the model runs" in result.settings_note


def test_derived_settings_read_metadata_and_the_users_sizes():
    model = fpn()
    # ultralytics' metadata: the image size and stride are sizes, the date and class indices are not
    helper.set_model_props(model, {"imgsz": "[640, 640]", "stride": "32", "date": "2023-05-01",
                                   "names": "{0: 'person', 17: 'horse'}"})
    origins = [origin for _, origin in derived_settings(model, {"batch": 2})]
    assert origins[0] == "derived from the model: multiples of its total stride 32"
    assert any(o.endswith("sizes it declares (640)") for o in origins)
    assert any("the sizes bound with --dim" in o for o in origins)
    assert len(origins) <= 12  # each one tried costs a run of the original


def paddle_model() -> onnx.ModelProto:
    """An old Paddle export's header: [-1, 3, '?', '?'] (two independent '?', a -1 batch)."""
    b = GraphBuilder(opset=17)
    x = b.input("x", ["?", 3, "?", "?"])
    y = conv(b, x, 3, 4)
    model = b.build(batchnorm(b, y, 4), output_names=["y"])
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].Clear()
    dims[0].dim_value = -1
    model.graph.output[0].type.tensor_type.ClearField("shape")  # not the unk__N onnx's inference wrote
    return model


def test_shared_placeholder_dims_bind_per_position():
    model = paddle_model()
    assert input_dim_keys(model) == {("x", 0): "x.dim0", ("x", 2): "x.dim2", ("x", 3): "x.dim3"}
    assert binding(model, {}, {"x": (2, 3, 16, 24)}) == {"x.dim0": 2, "x.dim2": 16, "x.dim3": 24}
    assert binding(model, {"?": 48}, {}) == {"?": 48, "x.dim2": 48, "x.dim3": 48}
    with pytest.raises(UsageError, match="dim 1 is fixed at 3 in the model, the option gives 4"):
        binding(model, {}, {"x": (2, 4, 16, 24)})
    with pytest.raises(UsageError, match="dim 2 is 'x.dim2', bound to 8 elsewhere, the option gives 16"):
        binding(model, {"x.dim2": 8}, {"x": (2, 3, 16, 24)})
    with pytest.raises(ValueError, match="dim 2 is 'x.dim2', bound to 8 elsewhere, but input_shapes gives 16"):
        infer_shapes(model, {"x.dim2": 8}, {"x": (2, 3, 16, 24)})
    table = infer_shapes(model, {}, {"x": (2, 3, 16, 24)})
    assert table.get("y").shape == (2, 4, 16, 24) and table.unused_dims == ()
    assert infer_shapes(model, {"x.dim2": 16, "x.dim9": 1}).unused_dims == ("x.dim9",)


@pytest.mark.parametrize("options", [{"input_shapes": {"x": (2, 3, 16, 24)}},
                                     {"dims": {"x.dim0": 2, "x.dim2": 16, "x.dim3": 24}}])
def test_input_shape_and_dim_feed_one_binding_for_estimate_and_verification(tmp_path, options):
    report = optimize(tmp_path, paddle_model(), **options)
    assert dict(report.dims) == {"x.dim0": 2, "x.dim2": 16, "x.dim3": 24}
    assert report.unbound_dims == ()
    assert report.verification.status == MATCH
    assert dict(report.verification.settings[0]) == {"x.dim0": 2, "x.dim2": 16, "x.dim3": 24}
    # the estimate's input is [2, 3, 16, 24]: 4 bytes each
    assert report.memory.before.peak_bytes >= 2 * 3 * 16 * 24 * 4


def test_input_shape_binds_verification_of_named_dims(tmp_path):
    report = optimize(tmp_path, fpn(), input_shapes={"x": (1, 3, 64, 96)})
    assert dict(report.verification.settings[0]) == {"batch": 1, "height": 64, "width": 96}
    reference = reference_for(fpn(), fpn(), {"batch": 1, "height": 64, "width": 96})
    assert reference.runs[0][1]["x"].shape == (1, 3, 64, 96)


def test_unbound_placeholder_dims_verify_at_distinct_sizes_and_are_listed_as_assumed(tmp_path):
    report = optimize(tmp_path, paddle_model())
    assert set(report.unbound_dims) == {"x.dim0", "x.dim2", "x.dim3"}
    first = dict(report.verification.settings[0])
    assert len({first["x.dim0"], first["x.dim2"], first["x.dim3"]}) == 3


def test_measurement_runs_at_the_batch_given_for_a_minus_one_dim(tmp_path):
    model = paddle_model()
    assert concrete_input_shapes(model, {}, {"x": (8, 3, 16, 16)}) == {"x": [8, 3, 16, 16]}
    assert concrete_input_shapes(model, {"x.dim0": 8, "?": 16}, {}) == {"x": [8, 3, 16, 16]}
    with pytest.raises(ValueError, match=r"x\[0\] \(x.dim0\)"):
        concrete_input_shapes(model, {"?": 16}, {})
    report = optimize(tmp_path, model, input_shapes={"x": (8, 3, 128, 128)}, measure=True)
    measured = report.measured.before
    if measured.exact_or_resident_bytes is None:
        pytest.skip(f"cannot measure here: {measured.reason}")
    one = measure_peak(tmp_path / "model.onnx", dims={"x.dim0": 1, "x.dim2": 128, "x.dim3": 128}, repeats=1)
    # batch 8 holds eight times batch 1's activations (the estimate and the run agree on it)
    assert measured.exact_or_resident_bytes > 4 * one.exact_or_resident_bytes
    assert 0.8 < report.memory.before.peak_bytes / measured.exact_or_resident_bytes < 1.25


def if_model(else_offset: float = 1.0, then_scale: float = 2.0) -> onnx.ModelProto:
    """y = If(use_cache_branch, x * then_scale, x + else_offset), the condition a bool graph input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    flag = helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])

    def branch(name, op, constant):
        c = helper.make_node("Constant", [], [f"{name}_c"],
                             value=helper.make_tensor(f"{name}_v", TensorProto.FLOAT, [], [constant]))
        return helper.make_graph([c, helper.make_node(op, ["x", f"{name}_c"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, ["batch", 4])])

    cond = helper.make_node("Squeeze", ["use_cache_branch"], ["cond"])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Mul", then_scale),
                            else_branch=branch("else", "Add", else_offset))
    graph = helper.make_graph([cond, node], "g", [x, flag], [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_bool_input_that_selects_a_branch_takes_both_values():
    model = if_model()
    assert branch_inputs(model) == ["use_cache_branch"]
    first, second = reference_plan(model).candidates[0]
    assert (first["use_cache_branch.value"], second["use_cache_branch.value"]) == (1, 0)
    reference = reference_for(model, model)
    assert [bool(feeds["use_cache_branch"].all()) for _, feeds, _ in reference.runs] == [True, False]
    assert verify_models(model, model).status == MATCH


@pytest.mark.parametrize("broken", [if_model(else_offset=1.01), if_model(then_scale=2.01)],
                         ids=["else-branch", "then-branch"])
def test_a_candidate_broken_in_one_branch_only_is_a_mismatch(broken):
    assert verify_models(if_model(), broken).status == MISMATCH


def test_a_static_model_with_a_branch_input_runs_both_branches():
    model = if_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    model.graph.output[0].type.tensor_type.shape.dim[0].Clear()
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 3
    assert [s["use_cache_branch.value"] for s in reference_plan(model).candidates[0]] == [1, 0]
    assert verify_models(model, if_model(else_offset=1.01)).status == MISMATCH


def test_a_model_that_takes_batch_1_only_verifies_two_extent_settings_at_batch_1():
    b = GraphBuilder(opset=17)
    x = b.input("x", ["batch", 3, "height", "width"])
    one = b.op("Unsqueeze", b.op("Squeeze", x, b.const(np.array([0], np.int64))), b.const(np.array([0], np.int64)))
    c1 = conv(b, one, 3, 4, strides=[2, 2])
    up = b.op("Resize", conv(b, c1, 4, 4, strides=[2, 2]), "", b.const(np.array([1, 1, 2, 2], np.float32)),
              mode="nearest")
    model = b.build(b.op("Concat", up, c1, axis=1), output_names=["y"])
    result = verify_models(model, model)
    assert result.status == MATCH
    first, second = (dict(s) for s in result.settings)
    assert first["batch"] == second["batch"] == 1
    assert first["height"] != second["height"] and first["width"] != second["width"]
    assert "batch the same at both" in result.settings_note


def test_a_feature_maps_declared_size_times_its_stride_is_a_derived_size():
    model = fpn()
    # the exporter's value_info for the second stride-2 Conv's output, written at an 80 x 80 input
    model.graph.value_info.append(helper.make_tensor_value_info("Conv_2_out", TensorProto.FLOAT, ["batch", 8, 20, 20]))
    assert any("sizes it declares (80)" in origin for _, origin in derived_settings(model))


def test_an_operator_onnxruntime_does_not_know_tries_no_derived_sizes(monkeypatch):
    """No size makes an unknown operator run: the original is loaded for the prime candidates only."""
    import fuse_cli.verify as verify

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    graph = helper.make_graph([helper.make_node("Foo", ["x"], ["y"], domain="x.y")], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("x.y", 1)],
                              ir_version=8)
    calls = []
    real = verify.reference_outputs
    monkeypatch.setattr(verify, "reference_outputs", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    result = verify_models(model, model)
    assert result.status == "unverifiable" and "x.y:Foo(-1) is not a registered function/op" in result.reason
    assert len(calls) == len(reference_plan(model).candidates)
    assert derived_settings(model)  # there were derived sizes to try


def test_an_stft_front_end_longer_than_the_primes_verifies_at_common_sample_counts():
    b = GraphBuilder(opset=18)
    x = b.op("Unsqueeze", b.input("audio", ["batch", "samples"]), b.const(np.array([2], np.int64)))
    spectrum = b.op("STFT", x, b.const(np.array(160, np.int64)), b.const(np.hanning(400).astype(np.float32)),
                    b.const(np.array(400, np.int64)), onesided=1)
    model = b.build(b.op("ReduceSumSquare", spectrum, b.const(np.array([3], np.int64)), keepdims=0), output_names=["y"])
    result = verify_models(model, model)
    assert result.status == MATCH
    assert [dict(s)["samples"] for s in result.settings] == [512, 1024]
    assert result.settings_note.endswith("settings derived from the model: common input sizes")


def test_a_dim_with_neither_name_nor_value_is_bound_by_position(tmp_path):
    b = GraphBuilder(opset=17)
    x = b.input("x", [1, 3, 8, None])
    model = b.build(batchnorm(b, conv(b, x, 3, 4), 4), output_names=["y"])
    model.graph.output[0].type.tensor_type.ClearField("shape")
    assert input_dim_keys(model) == {("x", 3): "x.dim3"}
    report = optimize(tmp_path, model, dims={"x.dim3": 12})
    assert dict(report.dims) == {"x.dim3": 12} and report.unbound_dims == ()
    assert dict(report.verification.settings[0]) == {"x.dim3": 12}
    assert report.verification.status == MATCH
    assert report.memory.before.peak_bytes >= 3 * 8 * 12 * 4


def test_every_symbol_bound_where_the_primes_fail_takes_a_derived_second_setting(tmp_path):
    report = optimize(tmp_path, window(), input_shapes={"audio": (2, 512)})
    result = report.verification
    assert result.status == MATCH
    assert [dict(s) for s in result.settings] == [{"batch": 2, "samples": 512}, {"batch": 5, "samples": 1024}]
    assert result.settings_note == "the bound setting, and one derived from the model: sizes it declares (512)"


def test_cli_binds_paddle_dims_by_position_and_refuses_a_bad_input_shape_in_one_line(tmp_path):
    import json

    from click.testing import CliRunner

    from fuse_cli.cli import cli

    path = tmp_path / "paddle.onnx"
    onnx.save(paddle_model(), path)
    ok = CliRunner().invoke(cli, ["report", str(path), "--input-shape", "x:2x3x16x24", "--dim", "x.dim0=2",
                                  "--json", "-"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout[ok.stdout.index("{"):])
    assert data["dims"] == {"x.dim0": 2, "x.dim2": 16, "x.dim3": 24}
    assert data["verification"]["settings"][0] == {"x.dim0": 2, "x.dim2": 16, "x.dim3": 24}
    # the written model keeps its declared header: binding is read, never written
    out = tmp_path / "out.onnx"
    assert CliRunner().invoke(cli, ["optimize", str(path), "-o", str(out), "--dim", "x.dim2=16"]).exit_code == 0
    dims = onnx.load(out).graph.input[0].type.tensor_type.shape.dim
    assert [(d.dim_value, d.dim_param) for d in dims] == [(-1, ""), (3, ""), (0, "?"), (0, "?")]
    for bad, message in ((["--input-shape", "y:1x3x8x8"], "--input-shape names 'y', which is not a graph input"),
                         (["--input-shape", "x:1x3x8"], "the model declares rank 4, the option gives rank 3"),
                         (["--input-shape", "x:2x3x16x24", "--dim", "x.dim0=4"], "dim 0 is 'x.dim0', bound to 4")):
        result = CliRunner().invoke(cli, ["report", str(path), *bad])
        assert result.exit_code == 2
        assert result.output.count("\n") == 1 and message in result.output, result.output


def test_unverifiable_says_the_derived_settings_failed_too():
    """A Split into [1, 1] along the samples: only 2 samples run, which no setting tries."""
    b = GraphBuilder(opset=17)
    left, right = b.op("Split", b.input("audio", ["batch", "samples"]), b.const(np.array([1, 1], np.int64)), axis=1,
                       outputs=2)
    model = b.build(b.op("Sub", left, right), output_names=["y"])
    result = verify_models(model, model)
    assert result.status == "unverifiable"
    assert result.reason.startswith("the original model cannot run at batch=")
    assert result.reason.endswith(f"; nor at any of {len(derived_settings(model))} settings derived from the model "
                                  "(its strides, declared and common sizes)")


def test_an_integer_an_if_compares_is_fed_that_value():
    """silero-vad's If(Equal(sr, 16000)): verification feeds the value the model names (at random,
    sr took the other branch, which fails on a 16 kHz window, and the model was unverifiable)."""
    from onnx import TensorProto, helper, numpy_helper

    from fuse_cli.input_domain import integer_ranges
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["is_rate"]),
         helper.make_node("If", ["is_rate"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(16000, np.int64), "rate")])
    assert integer_ranges(helper.make_model(graph))["sr"] == (16000, 16001)


def unnamed_batch_shared_with_a_state() -> onnx.ModelProto:
    """silero-vad's form: audio [?, ?] and a state [2, ?, 4] whose dims have neither a name nor a
    value; the graph concatenates per-row values of both, so audio's first dim must equal the
    state's second, and the reflect pad needs more than 64 samples."""
    b = GraphBuilder(opset=17)
    audio = b.input("audio", [None, None])
    state = b.input("state", [2, None, 4])
    padded = b.op("Pad", audio, b.const(np.array([0, 64, 0, 64], np.int64)), mode="reflect")
    energy = b.op("ReduceSum", b.op("Mul", padded, padded), b.const(np.array([1], np.int64)), keepdims=1)
    carried = b.op("Transpose", b.op("ReduceSum", state, b.const(np.array([0], np.int64)), keepdims=0), perm=[0, 1])
    joined = b.op("Concat", energy, carried, axis=1)
    y = b.op("Add", b.op("Mul", joined, b.const(np.float32(0.5))), b.const(b.rand(5)))
    return b.build(y, output_names=["y"])


def test_unnamed_dims_the_graph_equates_take_one_size_and_verify(tmp_path):
    model = unnamed_batch_shared_with_a_state()
    report = optimize(tmp_path, model)
    result = report.verification
    assert result.status == MATCH, result.reason
    setting = dict(result.settings[0])
    assert setting["audio.dim0"] == setting["state.dim1"] and setting["audio.dim1"] > 64
    assert "one size for every dim" in result.settings_note
    assert report.exit_code == 0


def test_torch_floor_dims_are_evaluated_exactly():
    """torch declares a strided conv's output as `floor(height/2 - 1/2) + 1`: with `/` exact and
    floor() applied, the size is what the runtime computes (height 641 -> 321, 640 -> 320); an
    expression that leaves a fraction is no size and stays unevaluated."""
    from fuse_cli.input_domain import with_declared_arithmetic

    b = GraphBuilder(opset=17)
    y = b.op("Relu", b.input("x", [1, "height"]))
    model = b.build(y, output_names=["y"])
    inner = "floor(height/2 - 1/2) + 1"
    for name, dims in (("c1", [1, inner]), ("c2", [1, f"floor(({inner})/2 - 1/2) + 1"]), ("half", [1, "height/2"]),
                       ("ceil", [1, "ceiling(height/4)"])):
        model.graph.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    at = with_declared_arithmetic(model, {"height": 641})
    assert at[inner] == 321 and at[f"floor(({inner})/2 - 1/2) + 1"] == 161 and at["ceiling(height/4)"] == 161
    assert "height/2" not in at  # 320.5
    assert with_declared_arithmetic(model, {"height": 640})["height/2"] == 320
