"""Model I/O: external data, what a round trip preserves, refused external-data locations, and
atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.errors import FuseError, ModelLoadError
from fuse_cli.graph import io, save
from fuse_cli.graph.io import load_model
from fuse_cli.graph.save import save_model
from tests.conftest import assert_equivalent
from tests.graphs import GraphBuilder, op_counts
from tests.test_cli import assert_one_line_error, invoke, no_temp_files, run_fuse, sha256


@pytest.fixture(autouse=True)
def _no_config_file_from_the_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def mlp_with_function(ir_version: int = 8) -> onnx.ModelProto:
    """[batch, 16] -> Identity -> Double (a model-local function) -> MatMul + Add (-> Gemm).
    Weights are large enough (4 KiB) to go to external data."""
    b = GraphBuilder(extra_opsets={"my.funcs": 1})
    x = b.input("x", ["batch", 16])
    doubled = b.op("Double", b.op("Identity", x), domain="my.funcs", name="double")
    y = b.op("Add", b.op("MatMul", doubled, b.const(b.rand(16, 64))), b.const(b.rand(64)))
    model = b.build(y, output_names=["y"], ir_version=ir_version)
    model.functions.append(helper.make_function(
        "my.funcs", "Double", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 17)], doc_string="2a"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64]))
    model.doc_string = "a model doc string"
    model.graph.doc_string = "a graph doc string"
    model.producer_name, model.producer_version = "some-exporter", "4.2"
    helper.set_model_props(model, {"author": "me", "license": "MIT"})
    return model


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.bin") -> Path:
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
              size_threshold=1024)
    return path


def external_locations(path: Path) -> set[str]:
    raw = onnx.load(path, load_external_data=False)
    return {e.value for t in raw.graph.initializer for e in t.external_data if e.key == "location"}


# --- external data ---

def test_model_with_external_data_round_trips(tmp_path):
    model = mlp_with_function()
    src = save_external(model, tmp_path / "net.onnx")
    assert external_locations(src) == {"weights.bin"}
    hashes = {p: sha256(p) for p in (src, tmp_path / "weights.bin")}

    result = invoke("optimize", src, "-o", tmp_path / "out.onnx")

    assert result.exit_code == 0, result.stderr
    assert {p: sha256(p) for p in hashes} == hashes
    out = onnx.load(tmp_path / "out.onnx")
    assert op_counts(out) == {"my.funcs::Double": 1, "Gemm": 1}
    assert_equivalent(model, out, dims={"batch": 3})


def test_external_data_flag_forces_a_side_data_file(tmp_path):
    model = mlp_with_function()
    onnx.save(model, tmp_path / "net.onnx")
    for _ in range(2):  # the second run finds the first run's pair: its data goes once the new pair stands
        result = invoke("optimize", "net.onnx", "-o", "out.onnx", "--external-data")
        assert result.exit_code == 0, result.stderr
    assert external_locations(tmp_path / "out.onnx") == {"out.onnx.1.data"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.")) == ["out.onnx", "out.onnx.1.data"]
    assert (tmp_path / "out.onnx.1.data").stat().st_size >= 16 * 64 * 4
    assert_equivalent(model, onnx.load(tmp_path / "out.onnx"), dims={"batch": 2})
    assert no_temp_files(tmp_path)


def test_external_data_written_to_another_folder_lands_beside_the_model(tmp_path):
    onnx.save(mlp_with_function(), tmp_path / "net.onnx")
    (tmp_path / "out").mkdir()
    (tmp_path / "out.onnx.data").write_bytes(b"an unrelated file in the working directory")
    result = invoke("optimize", "net.onnx", "-o", "out/out.onnx", "--external-data")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["out.onnx", "out.onnx.data"]
    assert (tmp_path / "out.onnx.data").read_bytes() == b"an unrelated file in the working directory"


def test_the_returned_model_keeps_its_weights_after_an_external_data_save(tmp_path):
    model = mlp_with_function()
    onnx.save(model, tmp_path / "net.onnx")
    result = api.optimize(tmp_path / "net.onnx", FuseConfig(external_data=True), tmp_path / "out.onnx")
    assert all(t.data_location == TensorProto.DEFAULT for t in result.model.graph.initializer)
    assert_equivalent(model, result.model, dims={"batch": 2})


def test_save_model_leaves_the_model_unchanged(tmp_path):
    model = mlp_with_function()
    before = model.SerializeToString()
    written = save_model(model, tmp_path / "m.onnx", external_data=True)
    assert written == [tmp_path / "m.onnx", tmp_path / "m.onnx.data"]
    assert model.SerializeToString() == before


def test_missing_or_short_external_data_is_a_one_line_error(tmp_path):
    src = save_external(mlp_with_function(), tmp_path / "net.onnx")
    data = tmp_path / "weights.bin"
    data.write_bytes(data.read_bytes()[:100])
    result = invoke("optimize", src)
    assert_one_line_error(result.exit_code, result.stderr, contains="cannot read external data")
    data.unlink()
    result = invoke("optimize", src)
    assert_one_line_error(result.exit_code, result.stderr, contains="cannot read external data")


def test_output_over_the_inputs_external_data_is_refused(tmp_path):
    save_external(mlp_with_function(), tmp_path / "net.onnx")
    before = sha256(tmp_path / "weights.bin")
    result = invoke("optimize", "net.onnx", "-o", "weights.bin")
    assert_one_line_error(result.exit_code, result.stderr, contains="overwrite the input's external data")
    assert sha256(tmp_path / "weights.bin") == before


# --- external data that points outside the model's folder ---

def _model_reading(location: str, *, as_constant: bool = False) -> onnx.ModelProto:
    """x + c, where c's 4 floats are external data at `location` (an initializer, or a Constant
    node's value)."""
    c = numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")
    c.ClearField("raw_data")
    c.data_location = TensorProto.EXTERNAL
    entry = c.external_data.add()
    entry.key, entry.value = "location", location
    nodes = [helper.make_node("Add", ["x", "c"], ["y"])]
    if as_constant:
        nodes.insert(0, helper.make_node("Constant", [], ["c"], value=c))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [] if as_constant else [c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _escape(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """A model folder and an external-data location for it that reaches outside."""
    folder = tmp_path / "models"
    folder.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())  # would load fine if it were read
    if kind == "parent":
        return folder, "../secret.bin"
    if kind == "absolute":
        return folder, str(secret)
    (folder / "weights.bin").symlink_to(secret)
    return folder, "weights.bin"


ESCAPES = ["parent", "absolute", "symlink"]


@pytest.mark.parametrize("as_constant", [False, True], ids=["initializer", "constant-node"])
@pytest.mark.parametrize("kind", ESCAPES)
def test_external_data_outside_the_model_folder_is_refused_and_never_read(kind, as_constant, tmp_path, monkeypatch):
    folder, location = _escape(kind, tmp_path)
    onnx.save(_model_reading(location, as_constant=as_constant), folder / "m.onnx")

    def never(*args, **kwargs):
        raise AssertionError("external data was opened")

    monkeypatch.setattr(onnx.external_data_helper, "_open_external_data_fd", never)
    with pytest.raises(ModelLoadError, match="refused"):
        load_model(folder / "m.onnx")


@pytest.mark.parametrize("kind", ESCAPES)
def test_external_data_outside_the_model_folder_is_a_one_line_error(kind, tmp_path):
    folder, location = _escape(kind, tmp_path)
    onnx.save(_model_reading(location), folder / "m.onnx")
    result = run_fuse("optimize", folder / "m.onnx", cwd=tmp_path)
    line = assert_one_line_error(result.returncode, result.stderr, result.stdout, contains="refused")
    assert "outside the model's folder" in line or "absolute" in line
    assert sorted(p.name for p in folder.iterdir()) == sorted({"m.onnx", *(["weights.bin"] * (kind == "symlink"))})


def test_external_data_in_a_subfolder_of_the_model_folder_is_read(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "c.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    onnx.save(_model_reading("data/c.bin"), tmp_path / "m.onnx")
    loaded = load_model(tmp_path / "m.onnx")
    (c,) = loaded.model.graph.initializer
    np.testing.assert_array_equal(numpy_helper.to_array(c), np.arange(4, dtype=np.float32))


# --- what a round trip preserves ---

@pytest.mark.parametrize("ir_version", [7, 8])
def test_optimize_preserves_the_model_shell(ir_version, tmp_path):
    model = mlp_with_function(ir_version)
    onnx.save(model, tmp_path / "net.onnx")

    result = invoke("optimize", "net.onnx")

    assert result.exit_code == 0, result.stderr
    out = onnx.load(tmp_path / "net.fused.onnx")
    assert op_counts(out) == {"my.funcs::Double": 1, "Gemm": 1}
    assert out.ir_version == ir_version
    assert list(out.opset_import) == list(model.opset_import)
    assert list(out.graph.input) == list(model.graph.input)
    assert list(out.graph.output) == list(model.graph.output)
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert list(out.functions) == list(model.functions)
    assert out.doc_string == model.doc_string
    assert out.graph.doc_string == model.graph.doc_string
    props = {p.key: p.value for p in out.metadata_props}
    assert {"author": "me", "license": "MIT"}.items() <= props.items()
    assert props["original_producer_name"] == "some-exporter"
    assert props["original_producer_version"] == "4.2"
    assert "fuse" in props
    assert out.producer_name == "fuse"
    assert_equivalent(model, out, dims={"batch": 2})


def test_a_second_optimization_keeps_the_original_producer(tmp_path):
    onnx.save(mlp_with_function(), tmp_path / "net.onnx")
    assert invoke("optimize", "net.onnx").exit_code == 0
    assert invoke("optimize", "net.fused.onnx").exit_code == 0
    props = {p.key: p.value for p in onnx.load(tmp_path / "net.fused.fused.onnx").metadata_props}
    assert props["original_producer_name"] == "some-exporter"


def _conv_bn_with_initializer_inputs(ir_version: int) -> onnx.ModelProto:
    b = GraphBuilder(opset=8 if ir_version < 4 else 17)
    x = b.input("x", [1, 3, 8, 8])
    c = b.op("Conv", x, b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)),
             b.const(b.rand(4)), b.const(b.rand(4, low=0.5, high=2.0)), epsilon=1e-3)
    return b.build(y, output_names=["y"], ir_version=ir_version, initializers_as_inputs=True)


def test_initializers_listed_as_inputs_stay_overridable_inputs(tmp_path):
    model = _conv_bn_with_initializer_inputs(ir_version=8)
    onnx.save(model, tmp_path / "m.onnx")
    assert invoke("optimize", "m.onnx").exit_code == 0
    out = onnx.load(tmp_path / "m.fused.onnx")
    assert [i.name for i in out.graph.input] == [i.name for i in model.graph.input]
    assert {t.name for t in out.graph.initializer} == {t.name for t in model.graph.initializer}
    assert op_counts(out) == {"Conv": 1, "BatchNormalization": 1}


def test_freeze_inputs_makes_listed_initializers_constants(tmp_path):
    model = _conv_bn_with_initializer_inputs(ir_version=8)
    onnx.save(model, tmp_path / "m.onnx")
    assert invoke("optimize", "m.onnx", "--freeze-inputs").exit_code == 0
    out = onnx.load(tmp_path / "m.fused.onnx")
    assert [i.name for i in out.graph.input] == ["x"]
    assert op_counts(out) == {"Conv": 1}
    assert_equivalent(model, out)


def test_below_ir_4_every_initializer_is_listed_as_an_input(tmp_path):
    onnx.save(_conv_bn_with_initializer_inputs(ir_version=3), tmp_path / "m.onnx")
    assert invoke("optimize", "m.onnx").exit_code == 0
    out = onnx.load(tmp_path / "m.fused.onnx")
    assert out.ir_version == 3
    assert op_counts(out) == {"Conv": 1}
    assert {t.name for t in out.graph.initializer} <= {i.name for i in out.graph.input}


# --- where and how the output is written ---

def test_default_output_is_stem_fused_onnx_beside_the_input(tmp_path):
    (tmp_path / "models").mkdir()
    onnx.save(mlp_with_function(), tmp_path / "models" / "net.v2.onnx")
    result = invoke("optimize", "models/net.v2.onnx")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["net.v2.fused.onnx", "net.v2.onnx"]
    assert api.default_output_path("a/b/model.onnx") == Path("a/b/model.fused.onnx")


def test_a_failed_write_leaves_no_temp_files_and_the_old_output_intact(tmp_path, monkeypatch):
    model = mlp_with_function()
    target = tmp_path / ".hidden.onnx"  # a dot name: its partial temp file must be removed too
    target.write_bytes(b"previous output")

    def half_written(proto, f, *args, **kwargs):
        Path(f).write_bytes(proto.SerializeToString()[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(io.onnx, "save_model", half_written)
    monkeypatch.setattr(save, "_write_streamed", half_written)
    for external_data in (False, True):
        with pytest.raises(FuseError, match="No space left on device"):
            save_model(model, target, external_data=external_data)
        assert target.read_bytes() == b"previous output"
        assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden.onnx"]


def test_a_successful_write_leaves_only_the_outputs(tmp_path):
    written = save_model(mlp_with_function(), tmp_path / ".hidden.onnx")
    assert written == [tmp_path / ".hidden.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden.onnx"]
    assert onnx.load(tmp_path / ".hidden.onnx").graph.output[0].name == "y"


def test_writing_into_a_missing_folder_is_a_fuse_error(tmp_path):
    with pytest.raises(FuseError, match="does not exist"):
        save_model(mlp_with_function(), tmp_path / "missing" / "m.onnx")
    assert not os.path.exists(tmp_path / "missing")


def test_the_streamed_write_reads_back_as_the_same_model(tmp_path):
    """Inline saves go out a weight at a time (graph field repeated, merged by the parser): the
    file must load as exactly the model, in onnx and in onnxruntime."""
    model = mlp_with_function()
    model.metadata_props.add(key="streamed-by", value="fuse tests")
    model.graph.initializer.add().CopyFrom(onnx.numpy_helper.from_array(np.arange(300, dtype=np.float32), "unused_w"))
    path = save_model(model, tmp_path / "m.onnx", external_data=False)[0]
    back = onnx.load(path)
    assert back.SerializeToString(deterministic=True) == model.SerializeToString(deterministic=True)
    assert [t.name for t in back.graph.initializer] == [t.name for t in model.graph.initializer]
    onnx.checker.check_model(str(path))


def test_inline_weights_over_the_protobuf_limit_are_refused_not_written(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "INLINE_SAVE_LIMIT_BYTES", 100)  # stands in for 2 GB
    model = mlp_with_function()
    with pytest.raises(FuseError, match="2 GB limit"):
        save_model(model, tmp_path / "m.onnx", external_data=False)
    assert list(tmp_path.iterdir()) == []
    written = save_model(model, tmp_path / "m.onnx")  # left to fuse: external data
    assert [p.name for p in written] == ["m.onnx", "m.onnx.data"]


@pytest.mark.parametrize("coordinates", [False, True], ids=["linear-indices", "coordinate-indices"])
def test_sparse_initializers_become_dense_with_their_values(tmp_path, coordinates):
    """graphsurgeon exported a sparse initializer as a float64 tensor of zeros: onnxruntime
    refused the output (Add of float and double). Loaded dense, values and dtype survive."""
    values = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "w")
    indices = np.array([[0, 1], [1, 2]] if coordinates else [1, 5], np.int64)
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(indices, "w_i"), [2, 3])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 3])],
                              sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "m.onnx")
    result = api.optimize(tmp_path / "m.onnx", FuseConfig(), tmp_path / "m.fused.onnx")
    assert result.report.verification.status == "match"
    (weight,) = onnx.load(tmp_path / "m.fused.onnx").graph.initializer
    dense = numpy_helper.to_array(weight)
    assert dense.dtype == np.float32 and dense[0, 1] == 1.5 and dense[1, 2] == -2.0 and np.count_nonzero(dense) == 2
