"""docs/passes.md is `fuse passes --markdown`, generated from the pass docstrings: these tests fail
when a pass changes and the reference was not regenerated, and check what the generator writes."""

import inspect
import re

import pytest
from click.testing import CliRunner

from fuse_cli.cli import cli
from fuse_cli.passes import REGISTRY, pipeline_for
from fuse_cli.report.passes import REGENERATE
from fuse_cli.targets import TARGETS
from tests.conftest import REPO

DOC = REPO / "docs" / "passes.md"


def markdown(*args: str) -> str:
    result = CliRunner().invoke(cli, ["passes", "--markdown", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def sections(text: str) -> dict[str, str]:
    """Pass name -> the text of its `### name` section."""
    parts = re.split(r"^### (\S+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_docs_passes_md_is_what_the_command_prints_now():
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        f"docs/passes.md is out of date: regenerate it with `{REGENERATE}` (from the repository root)")


def test_every_pass_has_its_section_with_its_whole_docstring():
    found = sections(markdown())
    assert sorted(found) == sorted(REGISTRY)
    for name, p in REGISTRY.items():
        assert p.description in found[name]
        assert inspect.cleandoc(p.explanation) in found[name], name


def test_pipeline_table_numbers_each_pass_by_its_place_in_each_target_pipeline():
    text = markdown()
    rows = {m[1]: [c.strip() for c in m[2].split(" | ")]
            for m in re.finditer(r"^\| \[`([^`]+)`\]\(#[^)]+\) \| (.*) \|$", text, re.M)}
    for column, target in enumerate(TARGETS):
        pipeline = pipeline_for(target)
        listed = sorted((int(cells[column]), name) for name, cells in rows.items() if cells[column] != "-")
        assert [name for _, name in listed] == list(pipeline), target


def test_one_target_lists_only_its_pipeline_in_run_order_and_names_the_rest():
    text = markdown("--target", "ort-cpu")
    assert list(sections(text)) == list(pipeline_for("ort-cpu"))
    left_out = set(REGISTRY) - set(pipeline_for("ort-cpu"))
    assert "skip-layer-norm" in left_out  # measured slower on the CPU: ort-cuda only
    not_in = re.search(r"^Not in this target's pipeline: (.*)\.$", text, re.M)[1]
    assert set(re.findall(r"`([^`]+)`", not_in)) == left_out
    assert "| usable |" in text  # what this target may emit, per operator


def test_portable_target_has_no_onnxruntime_tables():
    text = markdown("--target", "onnx")
    assert "## onnxruntime fused operators" not in text
    assert "com.microsoft::" not in text


@pytest.mark.parametrize("args", [(), ("--target", "ort")])
def test_every_table_row_has_as_many_cells_as_its_header(args):
    header_cells = None
    for line in markdown(*args).splitlines():
        if not line.startswith("|"):
            header_cells = None
            continue
        cells = len(re.findall(r"(?<!\\)\|", line)) - 1
        if header_cells is None:
            header_cells = cells
        assert cells == header_cells, line


def test_markdown_to_a_file_writes_the_same_text(tmp_path):
    target = tmp_path / "passes.md"
    result = CliRunner().invoke(cli, ["passes", "--markdown", str(target), "--target", "ort-cuda"])
    assert result.exit_code == 0, result.output
    assert target.read_text(encoding="utf-8") == markdown("--target", "ort-cuda")


def test_markdown_into_a_missing_folder_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(cli, ["passes", "--markdown", str(tmp_path / "no" / "passes.md")])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "does not exist" in result.stderr


def test_markdown_and_explain_together_is_a_usage_error():
    result = CliRunner().invoke(cli, ["passes", "--markdown", "--explain", "conv-bn"])
    assert result.exit_code == 2
    assert "give one of them" in result.stderr and result.stdout == ""
