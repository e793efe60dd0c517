"""The README's commands are run by tests, so what it shows stays what the tool does."""

import re
import shlex
import shutil

import pytest
from click.testing import CliRunner

from fuse_cli.cli import cli
from fuse_cli.passes import REGISTRY
from tests.conftest import REPO, SAMPLES

README = (REPO / "README.md").read_text(encoding="utf-8")


def fenced_commands(section: str) -> list[str]:
    """`fuse ...` lines (with `\\` continuations) in the code blocks of one README section."""
    body = README.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:\w+)?\n(.*?)```", body, re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    # commands, not printed output ("fuse optimize: model.onnx (target onnx)" is a table title)
    return [line.strip() for line in text.splitlines() if re.match(r"fuse [a-z]+(\s|$)", line.strip())]


def run(command: str, cwd, monkeypatch):
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, shlex.split(command)[1:])


def test_set_up_is_two_make_targets_that_exist():
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    targets = re.findall(r"^make (\w[\w-]*)", setup, re.M)
    assert targets[:2] == ["demo", "test"]
    makefile = (REPO / "Makefile").read_text()
    assert all(re.search(rf"^{t}:", makefile, re.M) for t in targets)


def test_every_pass_is_documented():
    missing = [name for name in REGISTRY if f"`{name}`" not in README]
    assert not missing, f"README does not mention: {missing}"


@pytest.fixture
def workdir(tmp_path):
    shutil.copy(SAMPLES / "cnn_bn_relu.onnx", tmp_path / "model.onnx")
    return tmp_path


def test_ci_gate_commands_fail_on_an_unoptimized_model_and_pass_on_an_optimized_one(workdir, monkeypatch):
    commands = fenced_commands("Use in CI")
    assert commands, "the CI section documents fuse commands"
    for command in commands:
        assert run(command, workdir, monkeypatch).exit_code == 1, command  # model.onnx is not fused yet
    optimized = run("fuse optimize model.onnx -o fused.onnx", workdir, monkeypatch)
    assert optimized.exit_code == 0, optimized.output
    (workdir / "fused.onnx").replace(workdir / "model.onnx")
    for command in commands:
        result = run(command, workdir, monkeypatch)
        assert result.exit_code == 0, f"{command}: {result.output}"


def test_quick_start_commands_run(workdir, monkeypatch):
    for command in fenced_commands("Quick start"):
        result = run(command, workdir, monkeypatch)
        assert result.exit_code == 0, f"{command}: {result.output}"
