"""The README and docs/ are run by tests: their commands run, the outputs the README shows are what
the commands print now, their links resolve, so what they say stays what the tool does."""

import re
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fuse_cli.cli import cli
from fuse_cli.config import load_config
from fuse_cli.targets import PROVIDER_NAMES, PROVIDERS_OF, TARGETS
from tests.conftest import REPO, SAMPLES

README = (REPO / "README.md").read_text(encoding="utf-8")
USAGE = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
        REPO / "benchmarks" / "results" / "2026-12-06-readme-figures.md"]
FRONT_PAGE_LINES = 200  # issue 33: the README is a front page, its detail lives in docs/


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def fenced_commands(text: str) -> list[str]:
    """`fuse ...` lines (with `\\` continuations) in the plain code blocks of `text`."""
    blocks = re.findall(r"```(?:\w+)?\n(.*?)```", text, re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    # commands, not printed output ("fuse optimize: model.onnx (target onnx)" is a table title)
    return [line.strip() for line in joined.splitlines() if re.match(r"fuse [a-z]+(\s|$)", line.strip())]


def console_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of each ```console block: `$ fuse ...` first."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        first, *shown = body.rstrip("\n").splitlines()
        assert first.startswith("$ fuse "), first
        blocks.append((first[2:], shown))
    return blocks


def run(command: str, cwd, monkeypatch):
    monkeypatch.chdir(cwd)
    return CliRunner().invoke(cli, shlex.split(command)[1:])


def test_set_up_is_two_make_targets_that_exist():
    setup = section(README, "Set up")
    targets = re.findall(r"^make (\w[\w-]*)", setup, re.M)
    assert targets[:2] == ["demo", "test"]
    makefile = (REPO / "Makefile").read_text()
    assert all(re.search(rf"^{t}:", makefile, re.M) for t in targets)


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= FRONT_PAGE_LINES
    assert "\n## Python API\n" in README


def test_readme_targets_table_is_the_target_table():
    rows = re.findall(r"^\| `([a-z-]+)`.*\| ([^|]+) \|$", section(README, "Targets"), re.M)
    assert [target for target, _ in rows] == list(TARGETS)
    for target, runs_on in rows:
        named = set(re.findall(r"\b(CPU|CUDA)\b", runs_on))
        assert named == {PROVIDER_NAMES[p] for p in PROVIDERS_OF[target]}, (target, runs_on)


def test_readme_shows_each_command_once():
    shown = [command.split()[1] for command, _ in console_blocks(README)]
    assert sorted(shown) == ["bench", "optimize", "passes", "report", "verify"]


def _heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.is_file() and resolved.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", resolved.read_text(encoding="utf-8"), re.M)
            if anchor not in {_heading_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{doc.name}: links that lead nowhere: {broken}"


@pytest.fixture
def samples_dir(tmp_path):
    """A folder holding a copy of sample_models/, so the README's commands run as written."""
    shutil.copytree(SAMPLES, tmp_path / "sample_models", ignore=shutil.ignore_patterns("*.fused.onnx"))
    return tmp_path


# What may differ between runs of the same command on the same model: the verification statistics'
# last digits (onnxruntime's kernels differ between CPUs) and, for `fuse bench`, every timing.
_STATISTIC = re.compile(r"\b\d\.\d+e[-+]\d+\b|(?<=rel diff )\d\.\d+")
_TIMED = ("fuse bench",)


def _same_line(shown: str, printed: str, timed: bool) -> bool:
    if timed and shown[:1] in "┏┃┡│└├":
        return re.findall(r"[A-Za-z]{2,}", shown) == re.findall(r"[A-Za-z]{2,}", printed)
    return _STATISTIC.sub("#", shown) == _STATISTIC.sub("#", printed)


@pytest.mark.parametrize("command, shown", [pytest.param(c, s, id=c.split()[1]) for c, s in console_blocks(README)])
def test_readme_output_is_what_the_command_prints(command, shown, samples_dir, monkeypatch):
    """Each line the README shows is printed, in that order; `...` stands for lines left out."""
    if ".fused.onnx" in command:  # verify reads what the README's optimize wrote
        for earlier, _ in console_blocks(README):
            if earlier.startswith("fuse optimize"):
                assert run(earlier, samples_dir, monkeypatch).exit_code == 0
    timed = command.startswith(_TIMED)
    result = run(command + (" --quick" if timed else ""), samples_dir, monkeypatch)  # the shape of it, fast
    assert result.exit_code == 0, f"{command}: {result.output}"
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    at = 0
    for line in shown:
        if line == "...":
            continue
        found = next((i for i in range(at, len(printed)) if _same_line(line, printed[i], timed)), None)
        assert found is not None, (f"README.md shows under `{command}` a line it no longer prints (paste the "
                                   f"command's output again):\n{line}\n--- it prints:\n" + "\n".join(printed))
        at = found + 1


@pytest.fixture
def workdir(tmp_path):
    shutil.copy(SAMPLES / "cnn_bn_relu.onnx", tmp_path / "model.onnx")
    return tmp_path


@pytest.mark.parametrize("doc", ["README.md", "docs/usage.md"])
def test_ci_gate_commands_fail_on_an_unoptimized_model_and_pass_on_an_optimized_one(doc, workdir, monkeypatch):
    commands = fenced_commands(section((REPO / doc).read_text(encoding="utf-8"), "Use in CI"))
    assert commands, f"{doc}'s CI section documents fuse commands"
    for command in commands:
        assert run(command, workdir, monkeypatch).exit_code == 1, command  # model.onnx is not fused yet
    optimized = run("fuse optimize model.onnx -o fused.onnx", workdir, monkeypatch)
    assert optimized.exit_code == 0, optimized.output
    (workdir / "fused.onnx").replace(workdir / "model.onnx")
    for command in commands:
        result = run(command, workdir, monkeypatch)
        assert result.exit_code == 0, f"{command}: {result.output}"


def test_usage_commands_run(workdir, monkeypatch):
    commands = fenced_commands(section(USAGE, "Commands"))
    assert {c.split()[1] for c in commands} == {"optimize", "report", "verify", "bench", "passes"}
    for command in commands:
        result = run(command, workdir, monkeypatch)
        assert result.exit_code == 0, f"{command}: {result.output}"


def test_usage_configuration_example_is_a_valid_config(tmp_path):
    example = re.search(r"```toml\n(.*?)```", section(USAGE, "Configuration"), re.S)[1]
    (tmp_path / "pyproject.toml").write_text(example, encoding="utf-8")
    config = load_config(Path(tmp_path))
    assert config.source.endswith("pyproject.toml")
    assert config.target in TARGETS and config.dims and config.disable
