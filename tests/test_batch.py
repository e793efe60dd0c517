"""Batch mode: many models in parallel processes, one failure does not stop the others."""

import json
import shutil

from click.testing import CliRunner

from fuse_cli.cli import cli
from tests.conftest import SAMPLES


def test_a_folder_and_a_broken_file_in_parallel(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("cnn_bn_relu.onnx", "mlp.onnx"):
        shutil.copy(SAMPLES / name, models / name)
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(cli, ["optimize", str(models), str(broken), "--out-dir", str(out), "-j", "2",
                                      "--no-verify", "--json", str(tmp_path / "batch.json")])
    assert result.exit_code == 1, result.output  # one model failed
    assert sorted(p.name for p in out.iterdir()) == ["cnn_bn_relu.fused.onnx", "mlp.fused.onnx"]
    records = json.loads((tmp_path / "batch.json").read_text())["models"]
    assert [r["model"] for r in records] == [str(models / "cnn_bn_relu.onnx"), str(models / "mlp.onnx"), str(broken)]
    assert [r["exit_code"] for r in records] == [0, 0, 2]
    assert records[0]["report"]["nodes"]["after"] < records[0]["report"]["nodes"]["before"]
    assert "not a readable ONNX model" in records[2]["error"]


def test_batch_refuses_single_model_options(tmp_path):
    result = CliRunner().invoke(cli, ["optimize", str(SAMPLES / "mlp.onnx"), str(SAMPLES / "cnn_bn_relu.onnx"),
                                      "-o", str(tmp_path / "x.onnx")])
    assert result.exit_code == 2 and "take one model" in result.stderr


def test_all_good_exits_0_and_json_to_stdout(tmp_path):
    result = CliRunner().invoke(cli, ["optimize", str(SAMPLES / "mlp.onnx"), "--out-dir", str(tmp_path), "-j", "1",
                                      "--json", "-"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["models"][0]["report"]["verification"]["passed"] is True
