"""Hostile files and unlucky moments around model I/O (issue 31, items 1 and 3): no byte is read
from outside the model's folder, whatever tensor names it (dense or sparse, in a branch or an
attribute), and the model and its data are written as one unit: a fresh data file per write, the
model renamed last, the old pair removed after, one run at a time per output."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.graphs import IR_VERSION
from tests.test_cli import invoke

SECRET = np.arange(4, dtype=np.float32) + 1000  # what a file outside the model's folder holds


def run_fuse(*args, cwd: Path, monkeypatch) -> tuple[int, str, str]:
    """The CLI in-process, from `cwd` (a relative location would be looked up there if anything
    resolved it against the working directory)."""
    monkeypatch.chdir(cwd)
    result = invoke(*args)
    return result.exit_code, result.stdout, result.stderr


def _external(tensor: onnx.TensorProto, location: str, length: int) -> onnx.TensorProto:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _sparse_model(location: str) -> onnx.ModelProto:
    """y = x + S, S a sparse initializer whose 4 values live in external data at `location`."""
    values = _external(numpy_helper.from_array(np.zeros(4, np.float32), "S"), location, SECRET.nbytes)
    indices = numpy_helper.from_array(np.array([0, 2, 5, 7], np.int64), "S_indices")
    sparse = helper.make_sparse_tensor(values, indices, [8])
    graph = helper.make_graph([helper.make_node("Add", ["x", "S"], ["y"], name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    graph.sparse_initializer.append(sparse)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def _constant_sparse_attribute_model(location: str) -> onnx.ModelProto:
    """y = x + Constant(sparse_value=S), S's values in external data at `location`."""
    values = _external(numpy_helper.from_array(np.zeros(4, np.float32), "S"), location, SECRET.nbytes)
    indices = numpy_helper.from_array(np.array([0, 2, 5, 7], np.int64), "S_indices")
    constant = helper.make_node("Constant", [], ["c"], name="const",
                                sparse_value=helper.make_sparse_tensor(values, indices, [8]))
    graph = helper.make_graph([constant, helper.make_node("Add", ["x", "c"], ["y"], name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def _branch_weight_model(location: str) -> onnx.ModelProto:
    """An If whose then branch holds a weight in external data at `location`."""
    weight = _external(numpy_helper.from_array(np.zeros(4, np.float32), "w"), location, SECRET.nbytes)
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])], [weight])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                    helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


BUILDERS = {"sparse-initializer": _sparse_model, "constant-sparse-value": _constant_sparse_attribute_model,
            "branch-weight": _branch_weight_model}


@pytest.fixture
def home(tmp_path):
    """A working directory holding a secret, and a model folder beside it."""
    (tmp_path / "secret.bin").write_bytes(SECRET.tobytes())
    (tmp_path / "models").mkdir()
    return tmp_path


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("how", ["cwd-relative", "parent", "absolute", "symlink-out"])
def test_external_bytes_from_outside_the_folder_are_refused(builder, how, home, monkeypatch):
    models = home / "models"
    location = {"cwd-relative": "secret.bin", "parent": "../secret.bin", "absolute": str(home / "secret.bin"),
                "symlink-out": "link.bin"}[how]
    if how == "symlink-out":
        (models / "link.bin").symlink_to(home / "secret.bin")
    onnx.save(BUILDERS[builder](location), models / "m.onnx")
    code, stdout, stderr = run_fuse("optimize", "models/m.onnx", "-o", "models/out.onnx", cwd=home,
                                    monkeypatch=monkeypatch)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    # a name inside the folder that is not there is as good as refused: it is looked for there only
    assert len(lines) == 1 and ("refused" in lines[0] or "cannot read external data" in lines[0]), lines
    assert "Traceback" not in stderr
    assert not (models / "out.onnx").exists()


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_external_bytes_inside_the_folder_are_read_from_it(builder, home, monkeypatch):
    """The same models with their data beside them run from another working directory: the values
    come from the model's folder (and a same-named file in the working directory is never read)."""
    models = home / "models"
    (models / "secret.bin").write_bytes((SECRET - 1000).tobytes())
    onnx.save(BUILDERS[builder]("secret.bin"), models / "m.onnx")
    code, stdout, stderr = run_fuse("optimize", "models/m.onnx", "-o", "models/out.onnx", "--json", "-", cwd=home,
                                    monkeypatch=monkeypatch)
    assert code == 0, stderr
    assert '"status": "match"' in stdout
    written = onnx.load(models / "out.onnx")
    assert SECRET.tobytes() not in written.SerializeToString()


def _weights_model(seed: int) -> onnx.ModelProto:
    """y = x @ W with a 64 KiB weight: enough for external data."""
    weight = np.random.default_rng(seed).standard_normal((128, 128)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 128])],
                              [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def _weight_of(path: Path) -> np.ndarray:
    return numpy_helper.to_array(onnx.load(path).graph.initializer[0])


def test_rewriting_an_output_replaces_the_pair(tmp_path, monkeypatch):
    for seed in (1, 2):
        onnx.save(_weights_model(seed), tmp_path / f"m{seed}.onnx")
        code, _, stderr = run_fuse("optimize", f"m{seed}.onnx", "-o", "out.onnx", "--external-data", cwd=tmp_path,
                                   monkeypatch=monkeypatch)
        assert code == 0, stderr
    np.testing.assert_array_equal(_weight_of(tmp_path / "out.onnx"), _weight_of(tmp_path / "m2.onnx"))
    data = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.onnx"))
    assert len(data) == 2 and data[0] == "out.onnx", data  # the model and the one data file it reads


def test_a_kill_before_the_model_rename_leaves_the_old_pair(tmp_path, monkeypatch):
    onnx.save(_weights_model(1), tmp_path / "m1.onnx")
    onnx.save(_weights_model(2), tmp_path / "m2.onnx")
    assert run_fuse("optimize", "m1.onnx", "-o", "out.onnx", "--external-data", cwd=tmp_path,
                    monkeypatch=monkeypatch)[0] == 0
    import fuse_cli.graph.io as io
    real_replace = os.replace

    def dies_at_the_model(src, dst):
        if Path(dst).name == "out.onnx":
            raise OSError("killed")
        real_replace(src, dst)
    monkeypatch.setattr(io.os, "replace", dies_at_the_model)
    code, _, stderr = run_fuse("optimize", "m2.onnx", "-o", "out.onnx", "--external-data", cwd=tmp_path,
                               monkeypatch=monkeypatch)
    assert code == 2 and "cannot write output" in stderr
    np.testing.assert_array_equal(_weight_of(tmp_path / "out.onnx"), _weight_of(tmp_path / "m1.onnx"))


def test_one_run_at_a_time_per_output(tmp_path, monkeypatch):
    from fuse_cli.graph.output import output_lock
    onnx.save(_weights_model(1), tmp_path / "m.onnx")
    with output_lock(tmp_path / "out.onnx"):
        code, _, stderr = run_fuse("optimize", "m.onnx", "-o", "out.onnx", cwd=tmp_path, monkeypatch=monkeypatch)
    assert code == 2 and "another fuse run is writing this output" in stderr
    assert not (tmp_path / "out.onnx").exists()
    assert run_fuse("optimize", "m.onnx", "-o", "out.onnx", cwd=tmp_path, monkeypatch=monkeypatch)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]  # the lock file went too


def test_two_processes_writing_one_output(tmp_path):
    """Real processes at once: each finishes or is refused, and the output is one run's whole pair."""
    import subprocess
    import sys
    for seed in (1, 2):
        onnx.save(_weights_model(seed), tmp_path / f"m{seed}.onnx")
    runs = [subprocess.Popen([sys.executable, "-m", "fuse_cli", "optimize", f"m{seed}.onnx", "-o", "out.onnx",
                              "--external-data", "--no-verify"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(run.wait(timeout=120), run.stderr.read()) for run in runs]
    assert all(code == 0 or (code == 2 and "another fuse run" in err) for code, err in results), results
    written = _weight_of(tmp_path / "out.onnx")
    assert any(np.array_equal(written, _weight_of(tmp_path / f"m{seed}.onnx")) for seed in (1, 2))
    assert len([p for p in tmp_path.iterdir() if p.name.endswith(".data")]) == 1


def test_verify_input_files_naming_external_data_are_refused(home, monkeypatch):
    """`fuse verify --inputs DIR`: a .pb tensor whose values live in external data would be read
    relative to the working directory. Refused, one line."""
    models = home / "models"
    onnx.save(_weights_model(1), models / "m.onnx")
    feeds = models / "feeds"
    feeds.mkdir()
    tensor = _external(numpy_helper.from_array(np.zeros((2, 128), np.float32), "x"), "secret.bin", 2 * 128 * 4)
    (feeds / "x.pb").write_bytes(tensor.SerializeToString())
    code, stdout, stderr = run_fuse("verify", "models/m.onnx", "models/m.onnx", "--inputs", "models/feeds", cwd=home,
                                    monkeypatch=monkeypatch)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "external data" in stderr, stderr


def test_the_memory_cap_counts_the_onnxruntime_worker(tmp_path):
    """Verification runs the model in the worker process: a 512 MB intermediate there (its output
    one number, so fuse's own process stays small) is the run's memory too."""
    import subprocess
    import sys
    shape = numpy_helper.from_array(np.array([2**27], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Expand", ["x", "shape"], ["big"], name="expand"),
                               helper.make_node("ReduceSum", ["big"], ["y"], name="sum", keepdims=0)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION),
              tmp_path / "m.onnx")
    done = subprocess.run([sys.executable, "-m", "fuse_cli", "optimize", "m.onnx", "-o", "out.onnx", "--max-memory",
                           "300"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "memory use reached --max-memory (300 MB)" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.onnx").exists()
