"""Configuration files ([tool.fuse] in pyproject.toml, fuse.toml) and their precedence under CLI flags."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from fuse_cli.config import FuseConfig, find_config_file, load_config, parse_dims, parse_input_shapes
from fuse_cli.errors import UsageError
from tests.test_cli import assert_one_line_error, conv_bn_model, invoke, run_fuse

FULL_TABLE = """
target = "ort"
passes = ["conv-bn", "matmul-add"]
disable = "matmul-add"
dims = { batch = 4, seq = 128 }
freeze-inputs = true
fold-limit = 8
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def report_json(*args) -> dict:
    """`fuse report m.onnx --json - ...` in the working directory: the effective settings."""
    onnx.save(conv_bn_model(), "m.onnx")
    result = invoke("report", "m.onnx", "--json", "-", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_no_file_gives_the_defaults(tmp_path):
    assert find_config_file(tmp_path) is None
    assert load_config() == FuseConfig()


def test_every_key_of_a_fuse_toml(tmp_path):
    path = write(tmp_path / "fuse.toml", FULL_TABLE)
    config = load_config()
    assert config == FuseConfig(target="ort", passes=("conv-bn", "matmul-add"), disable=("matmul-add",),
                                dims={"batch": 4, "seq": 128}, freeze_inputs=True, fold_limit_bytes=8 * 2**20,
                                source=str(path))


def test_tool_fuse_table_of_a_pyproject_found_from_a_subfolder(tmp_path, monkeypatch):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.fuse]\n" + FULL_TABLE)
    (tmp_path / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "src" / "deep")
    config = load_config()
    assert config.source == str(tmp_path / "pyproject.toml")
    assert config.target == "ort" and config.dims == {"batch": 4, "seq": 128}


def test_a_pyproject_without_tool_fuse_is_skipped(tmp_path, monkeypatch):
    write(tmp_path / "fuse.toml", 'target = "ort-cpu"\n')
    write(tmp_path / "app" / "pyproject.toml", "[tool.black]\nline-length = 100\n")
    monkeypatch.chdir(tmp_path / "app")
    assert load_config().target == "ort-cpu"


def test_the_nearest_file_wins_and_fuse_toml_beats_pyproject_in_one_folder(tmp_path, monkeypatch):
    write(tmp_path / "fuse.toml", 'target = "ort"\n')
    write(tmp_path / "app" / "pyproject.toml", '[tool.fuse]\ntarget = "ort-cpu"\n')
    monkeypatch.chdir(tmp_path / "app")
    assert load_config().target == "ort-cpu"
    write(tmp_path / "app" / "fuse.toml", 'target = "ort-cuda"\n')
    assert load_config().target == "ort-cuda"


def test_the_file_applies_to_the_cli():
    write(Path("fuse.toml"), 'passes = ["conv-bn"]\ntarget = "ort"\n[dims]\nbatch = 3\n')
    data = report_json()
    assert data["passes"] == ["conv-bn"]
    assert data["target"] == "ort"
    assert data["dims"] == {"batch": 3}


def test_cli_flags_win_over_file_keys():
    write(Path("fuse.toml"), 'passes = ["conv-bn"]\ntarget = "ort"\ndisable = ["matmul-add"]\n[dims]\nbatch = 3\n')
    data = report_json("--passes", "eliminate-identity,matmul-add", "--target", "onnx", "--disable", "",
                       "--dim", "batch=5", "--dim", "seq=7")
    assert data["passes"] == ["eliminate-identity", "matmul-add"]
    assert data["target"] == "onnx"
    assert data["dims"] == {"batch": 5, "seq": 7}


def test_freeze_inputs_and_fold_limit_from_the_file():
    write(Path("fuse.toml"), "freeze-inputs = true\nfold-limit = 0.5\n")
    config = load_config()
    assert config.freeze_inputs is True
    assert config.fold_limit_bytes == 2**19
    assert config.with_overrides(freeze_inputs=None, fold_limit_bytes=2**20).fold_limit_bytes == 2**20


@pytest.mark.parametrize("text, expected", [
    ("colour = 'blue'\n", "unknown key 'colour'"),
    ("target = 1\n", "bad value for 'target'"),
    ("passes = 3\n", "bad value for 'passes'"),
    ("passes = [1, 2]\n", "bad value for 'passes'"),
    ("dims = 4\n", "bad value for 'dims'"),
    ("dims = { batch = 0 }\n", "not a positive integer"),
    ("dims = { batch = 2.5 }\n", "not a positive integer"),
    ("dims = { batch = 'x' }\n", "not a positive integer"),
    ("freeze-inputs = 'yes'\n", "bad value for 'freeze-inputs'"),
    ("fold-limit = -1\n", "bad value for 'fold-limit'"),
    ("fold-limit = inf\n", "bad value for 'fold-limit'"),
    ("fold-limit = true\n", "bad value for 'fold-limit'"),
    ("target = \n", "cannot read configuration"),
    ("[dims\nbatch = 1\n", "cannot read configuration"),
])
def test_bad_file_content_is_a_usage_error(text, expected):
    write(Path("fuse.toml"), text)
    with pytest.raises(UsageError, match=expected):
        load_config()


@pytest.mark.parametrize("text", [
    "[tool]\nfuse = 3\n",
    "[tool.fuse]\ntarget = 'onnx'\nverbose = true\n",
    "[tool.fuse\n",
])
def test_bad_pyproject_is_a_usage_error(text):
    write(Path("pyproject.toml"), text)
    with pytest.raises(UsageError, match="pyproject.toml"):
        load_config()


def test_unknown_key_is_a_one_line_usage_error_of_the_cli(tmp_path):
    write(tmp_path / "fuse.toml", "target = 'onnx'\nbatch-size = 8\n")
    onnx.save(conv_bn_model(), tmp_path / "m.onnx")
    result = run_fuse("report", "m.onnx", cwd=tmp_path)
    line = assert_one_line_error(result.returncode, result.stderr, result.stdout, contains="unknown key 'batch-size'")
    assert "fuse.toml" in line


def test_malformed_toml_is_a_one_line_error_of_the_cli(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.fuse]\ntarget = "onnx\npasses = [\n')
    onnx.save(conv_bn_model(), tmp_path / "m.onnx")
    result = run_fuse("optimize", "m.onnx", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, result.stdout, contains="cannot read configuration")
    assert not (tmp_path / "m.fused.onnx").exists()


def test_unknown_pass_in_the_file_is_a_usage_error_with_a_suggestion():
    write(Path("fuse.toml"), 'passes = ["conv_bn"]\n')
    onnx.save(conv_bn_model(), "m.onnx")
    result = invoke("report", "m.onnx")
    assert_one_line_error(result.exit_code, result.stderr, result.stdout, contains="did you mean 'conv-bn'")


def test_parse_dims_and_input_shapes():
    assert parse_dims(("batch=8", " seq = 16 ")) == {"batch": 8, "seq": 16}
    assert parse_input_shapes(("image:1x3X224x224", "ns:scope:x:2")) == {"image": (1, 3, 224, 224), "ns:scope:x": (2,)}
    for bad in ("batch", "=3", "batch=-1", "batch=1.5"):
        with pytest.raises(UsageError, match="--dim"):
            parse_dims((bad,))
    for bad in ("image", "image:", "image:1xx3", ":1x3"):
        with pytest.raises(UsageError, match="--input-shape"):
            parse_input_shapes((bad,))
