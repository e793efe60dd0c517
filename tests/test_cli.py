"""The command line end to end: bad input is one line on stderr and exit 2, never a traceback,
and the input file is never touched; success writes the fused model; the informational commands.

Real processes (`python -m fuse_cli`) check what a user sees; click's CliRunner covers the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from fuse_cli import __version__
from fuse_cli.cli import cli
from fuse_cli.passes import REGISTRY
from tests.graphs import GraphBuilder, op_counts


def run_fuse(*args: str | os.PathLike, cwd: Path) -> subprocess.CompletedProcess:
    """A real `fuse` process, as a user or a CI job runs it."""
    return subprocess.run([sys.executable, "-m", "fuse_cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "ORT_LOGGING_LEVEL": "3"})


def invoke(*args: str | os.PathLike):
    """The CLI in-process; stdout and stderr are kept apart (click >= 8.2)."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_one_line_error(code: int, stderr: str, stdout: str = "", *, contains: str = "") -> str:
    assert code == 2, f"exit {code}; stderr: {stderr}"
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fuse: error:"), stderr
    assert "Traceback" not in stderr + stdout
    assert contains in lines[0]
    return lines[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_temp_files(folder: Path) -> bool:
    """The atomic writer's temp folders start with a dot."""
    return not any(p.name.startswith(".") for p in folder.rglob("*"))


def conv_bn_model(*, opset: int = 17, extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
    b = GraphBuilder(opset=opset, extra_opsets=extra_opsets)
    x = b.input("x", [1, 3, 8, 8])
    c = b.op("Conv", b.op("Identity", x), b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)),
             b.const(b.rand(4)), b.const(b.rand(4, low=0.5, high=2.0)), epsilon=1e-3)
    return b.build(y, output_names=["y"])


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(conv_bn_model(), path)
    return path


@pytest.fixture(autouse=True)
def _no_config_file_from_the_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# --- bad input: each case makes its files in tmp_path and returns (fuse arguments, expected text) ---

def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _saved(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def _model(folder: Path) -> Path:
    return _saved(conv_bn_model(), folder / "m.onnx")


def _unproduced_input_model() -> onnx.ModelProto:
    node = helper.make_node("Add", ["x", "ghost"], ["y"], name="add")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _opset_99_model() -> onnx.ModelProto:
    model = conv_bn_model()
    model.opset_import[0].version = 99
    return model


def _directory(folder: Path) -> list:
    (folder / "folder.onnx").mkdir()
    return ["optimize", folder / "folder.onnx"]


def _truncated(folder: Path) -> list:
    data = conv_bn_model().SerializeToString()
    return ["optimize", _write(folder / "half.onnx", data[: len(data) // 2])]


def _output_is_input_spelled_differently(folder: Path) -> list:
    (folder / "sub").mkdir()
    return ["optimize", _model(folder), "-o", "sub/../m.onnx"]


def _output_is_symlink_to_input(folder: Path) -> list:
    model = _model(folder)
    (folder / "link.onnx").symlink_to(model)
    return ["optimize", model, "-o", folder / "link.onnx"]


BAD_INPUTS: dict[str, tuple[Callable[[Path], list], str]] = {
    "missing path": (lambda d: ["optimize", d / "missing.onnx"], "no such file"),
    "directory": (_directory, "directory"),
    "empty file": (lambda d: ["optimize", _write(d / "empty.onnx", b"")], "empty"),
    "random bytes": (lambda d: ["optimize", _write(d / "random.onnx", np.random.default_rng(0).bytes(4096))], "ONNX"),
    "text file": (lambda d: ["optimize", _write(d / "notes.onnx", b"name: not a model\nversion 3\n")], "ONNX"),
    "truncated model": (_truncated, "half.onnx"),
    "tensor nobody produces": (lambda d: ["optimize", _saved(_unproduced_input_model(), d / "ghost.onnx")],
                               "'ghost', which nothing produces"),
    "opset newer than onnx knows": (lambda d: ["optimize", _saved(_opset_99_model(), d / "future.onnx")], "opset 99"),
    "output under a missing folder": (lambda d: ["optimize", _model(d), "-o", d / "no" / "such" / "out.onnx"],
                                      "does not exist"),
    "output under /proc": (lambda d: ["optimize", _model(d), "-o", "/proc/fuse-test-out.onnx"], "cannot write"),
    "output is the input": (lambda d: ["optimize", _model(d), "-o", d / "m.onnx"], "--in-place"),
    "output is the input, spelled differently": (_output_is_input_spelled_differently, "--in-place"),
    "output is a symlink to the input": (_output_is_symlink_to_input, "--in-place"),
    "output is a directory": (lambda d: ["optimize", _model(d), "-o", d], "directory"),
    "unknown pass": (lambda d: ["optimize", _model(d), "--passes", "conv-nb"], "did you mean 'conv-bn'"),
    "unknown disabled pass": (lambda d: ["report", _model(d), "--disable", "matmul_add"], "did you mean 'matmul-add'"),
    "--dim without =": (lambda d: ["report", _model(d), "--dim", "batch"], "--dim"),
    "--dim with a colon": (lambda d: ["report", _model(d), "--dim", "batch:8"], "--dim"),
    "--dim without a name": (lambda d: ["report", _model(d), "--dim", "=8"], "--dim"),
    "--dim not a number": (lambda d: ["report", _model(d), "--dim", "batch=x"], "not a positive integer"),
    "--dim zero": (lambda d: ["report", _model(d), "--dim", "batch=0"], "not a positive integer"),
    "--input-shape not a shape": (lambda d: ["report", _model(d), "--input-shape", "x:1xAx8x8"],
                                  "not a positive integer"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_leaves_the_input_alone(case, tmp_path):
    make, expected = BAD_INPUTS[case]
    args = make(tmp_path)
    inputs = {p: sha256(p) for p in tmp_path.iterdir() if p.is_file() and not p.is_symlink()}
    before = set(tmp_path.rglob("*"))

    result = run_fuse(*args, cwd=tmp_path)

    assert_one_line_error(result.returncode, result.stderr, result.stdout, contains=expected)
    assert {p: sha256(p) for p in inputs} == inputs
    assert set(tmp_path.rglob("*")) == before, "a failed run must not leave files behind"


def test_debug_shows_the_traceback(tmp_path):
    result = run_fuse("optimize", tmp_path / "missing.onnx", "--debug", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "no such file" in result.stderr


def test_optimize_succeeds_with_exit_0_and_writes_beside_the_input(tmp_path, model_file):
    before = sha256(model_file)
    result = run_fuse("optimize", model_file.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert sha256(model_file) == before
    assert op_counts(onnx.load(tmp_path / "model.fused.onnx")) == {"Conv": 1}
    assert no_temp_files(tmp_path)


def test_in_place_overwrites_the_input_atomically(tmp_path, model_file):
    result = invoke("optimize", model_file, "-o", model_file, "--in-place")
    assert result.exit_code == 0, result.stderr
    assert op_counts(onnx.load(model_file)) == {"Conv": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_report_writes_nothing(tmp_path, model_file):
    result = invoke("report", model_file)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_custom_domain_nodes_are_left_untouched_while_the_rest_is_optimized(tmp_path):
    """A user-domain op onnxruntime cannot run, and a com.microsoft one, between fusable nodes."""
    b = GraphBuilder(extra_opsets={"com.microsoft": 1, "my.domain": 1})
    x = b.input("x", [1, 3, 8, 8])
    frob = b.op("Frobnicate", b.op("Identity", x), b.const(b.rand(3)), domain="my.domain", name="frob", mode=b"fast")
    const_frob = b.op("Frobnicate", b.const(b.rand(4)), domain="my.domain", name="frob_of_constants")
    gelu = b.op("Gelu", frob, domain="com.microsoft", name="ms_gelu")
    c = b.op("Conv", gelu, b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)),
             b.const(b.rand(4)), b.const(b.rand(4, low=0.5, high=2.0)), epsilon=1e-3)
    model = b.build(b.op("Add", y, b.op("Unsqueeze", const_frob, b.const([1, 2], dtype=np.int64))),
                    output_names=["y"])
    onnx.save(model, tmp_path / "custom.onnx")

    result = invoke("optimize", tmp_path / "custom.onnx", "-o", tmp_path / "out.onnx")

    assert result.exit_code == 0, result.stderr
    out = onnx.load(tmp_path / "out.onnx")
    assert op_counts(out) == {"my.domain::Frobnicate": 2, "com.microsoft::Gelu": 1, "Conv": 1, "Unsqueeze": 1,
                              "Add": 1}
    original = {n.name: n for n in model.graph.node if n.domain}
    kept = {n.name: n for n in out.graph.node if n.domain}
    assert kept.keys() == original.keys()
    for name, node in kept.items():
        assert node.op_type == original[name].op_type and node.domain == original[name].domain
        assert list(node.attribute) == list(original[name].attribute)
        assert list(node.output) == list(original[name].output)
    assert out.opset_import == model.opset_import


# --- informational commands and report formats ---

def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert __version__ in result.stdout


def test_version_from_the_installed_console_script():
    script = Path(sys.executable).with_name("fuse")
    if not script.exists():
        pytest.skip("the fuse console script is not installed next to this interpreter")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"fuse, version {__version__}"


def test_passes_lists_every_registered_pass(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = invoke("passes")
    assert result.exit_code == 0, result.stderr
    for name in REGISTRY:
        assert name in result.stdout


def test_passes_on_a_narrow_terminal_still_shows_every_name(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    result = invoke("passes")
    assert result.exit_code == 0, result.stderr
    for name in REGISTRY:
        assert name in result.stdout


def test_passes_explain_prints_the_docstring():
    result = invoke("passes", "--explain", "conv-bn")
    assert result.exit_code == 0, result.stderr
    doc = REGISTRY["conv-bn"].explanation
    assert doc.splitlines()[0].strip() in result.stdout
    assert "sqrt(var + eps)" in result.stdout


def test_passes_explain_unknown_pass_is_a_usage_error():
    result = invoke("passes", "--explain", "conv-nb")
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, contains="did you mean 'conv-bn'")


def test_json_to_stdout_is_valid_json_and_the_table_goes_to_stderr(tmp_path, model_file):
    result = run_fuse("optimize", model_file, "--json", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["tool"] == "fuse" and "schema_version" in data
    assert "conv-bn" in [f["pass"] for f in data["fusions"]]
    assert "conv-bn" in result.stderr


def test_json_to_stdout_stays_valid_when_graphsurgeon_warns(tmp_path):
    b = GraphBuilder(extra_opsets={"my.domain": 1})
    y = b.op("Frobnicate", b.op("Identity", b.input("x", [2, 4])), domain="my.domain")
    onnx.save(b.build(y, output_names=["y"]), tmp_path / "m.onnx")  # y's dtype is unknown: gs warns
    result = run_fuse("report", "m.onnx", "--json", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)


def test_markdown_report_is_written_with_a_table(tmp_path, model_file):
    result = invoke("report", model_file, "--markdown", tmp_path / "report.md")
    assert result.exit_code == 0, result.stderr
    lines = (tmp_path / "report.md").read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| Pattern"))
    assert set(lines[header + 1]) <= set("|-:")
    assert any(line.startswith("| ") and "conv-bn" in line for line in lines[header + 2:])


def test_markdown_to_an_unwritable_path_is_one_line(tmp_path, model_file):
    result = invoke("report", model_file, "--markdown", tmp_path / "no" / "report.md")
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, contains="cannot write")


@pytest.mark.parametrize("command", [["verify", "{m}", "{m}", "--json"],
                                     ["bench", "{m}", "--quick", "--no-memory", "--json"],
                                     ["report", "{m}", "{copy}", "--json"]],
                         ids=["verify", "bench", "batch"])
def test_every_command_writes_json_through_one_path_with_one_line_errors(tmp_path, model_file, command):
    """A missing folder is bad input (exit 2, one line), never an internal error."""
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(Path(model_file).read_bytes())
    args = [str(a).format(m=model_file, copy=copy) for a in command] + [tmp_path / "no" / "r.json"]
    result = invoke(*args)
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, contains="cannot write")


def test_relative_output_folder_beside_an_input_elsewhere(tmp_path):
    """`fuse optimize /elsewhere/m.onnx -o out/m.onnx`: the weights a pass computes (a folded
    Transpose of a 256 KiB weight) are parked beside the output, and the weights it keeps are read
    in place from the input; onnxruntime must find both (it resolves relative locations against
    the input's folder then)."""
    b = GraphBuilder(opset=17)
    weight = b.op("Transpose", b.const(b.rand(256, 256)), perm=[1, 0])
    hidden = b.op("MatMul", b.input("x", ["batch", 256]), weight)
    model = b.build(b.op("MatMul", hidden, b.const(b.rand(256, 256))), output_names=["y"])
    source = tmp_path / "models" / "m.onnx"
    source.parent.mkdir()
    onnx.save(model, source)
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    done = run_fuse("optimize", source, "-o", "out/m.onnx", "--require-verified", "--json", "-", cwd=work)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout[done.stdout.index("{"):])
    assert report["verification"]["status"] == "match" and not report["rolled_back"]
    assert any(f["pass"] == "fold-constants" for f in report["fusions"])
    assert op_counts(onnx.load(work / "out" / "m.onnx"))["Transpose"] == 0
