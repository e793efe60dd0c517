"""Every report fits 80 and 120 columns (a CI log's width): each header's column holds its values.

The rendered text is parsed back: a table's column rules stand where its top border put them on
every line (a value never spills under a neighbour's header), each column read top to bottom
holds exactly the values the report has for it, whole, and no line is wider than the console.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from fuse_cli import api
from fuse_cli.bench import QUICK, bench
from fuse_cli.cli import cli
from fuse_cli.config import FuseConfig
from fuse_cli.passes import REGISTRY
from fuse_cli.report.bench import BENCH_HEADERS, bench_table_rows, render_bench_rich
from fuse_cli.report.render import human_bytes, near_miss_groups, render_rich, render_verify_rich, savings_rows
from fuse_cli.report.table_fit import Column, fitted_table, plan_widths
from fuse_cli.report.text import short_dim, short_dims_in
from fuse_cli.verify import verify_models
from tests.conftest import SAMPLES
from tests.llama_graphs import llama_attention_model

WIDTHS = (80, 120)
DIM_HEAD = 30  # the start of a long dim that its shortened form keeps


# ------------------------------------------------------------------------------ reading a table back

@dataclass
class ParsedTable:
    headers: list[str]
    rows: list[list[str]]  # one entry per row a rule closes; a table without rules between rows: one
    title: str


def parsed_tables(text: str) -> list[ParsedTable]:
    """Every box-drawn table in `text`. Asserts, per line, that the column rules stand where the
    top border has them and that one space pads each side of each cell."""
    lines, tables = text.splitlines(), []
    for start, top in enumerate(lines):
        if not top.startswith("┏"):
            continue
        rules = [i for i, c in enumerate(top) if c in "┏┳┓"]
        headers, rows, row, part = [[] for _ in rules[1:]], [], None, "head"
        for line in lines[start + 1:]:
            if line.startswith("└"):
                break
            if line[0] in "┡├":
                assert [i for i, c in enumerate(line) if c in "┡╇┩├┼┤"] == rules, f"a rule moved:\n{line}"
                if row is not None:
                    rows.append(row)
                row, part = [[] for _ in rules[1:]], "body"
                continue
            assert [i for i, c in enumerate(line) if c in "┃│"] == rules, f"a value left its column:\n{line}"
            for column, (a, b) in enumerate(zip(rules, rules[1:])):
                cell = line[a + 1:b]
                assert cell.startswith(" ") and cell.endswith(" "), f"a value touches its rule:\n{line}"
                (headers if part == "head" else row)[column].append(cell.strip())
        rows.append(row)
        tables.append(ParsedTable([" ".join(filter(None, h)) for h in headers],
                                  [[" ".join(filter(None, c)) for c in r] for r in rows], lines[start - 1].strip()))
    return tables


def squashed(text: str) -> str:
    """Text as a column holds it: wrapped or folded anywhere, so compared without whitespace."""
    return re.sub(r"\s+", "", text)


def assert_columns_hold(table: ParsedTable, headers, rows, *, by_row: bool) -> None:
    assert [squashed(h) for h in table.headers] == [squashed(h) for h in headers]
    if by_row:  # a rule closes each row: each cell holds its value
        assert [[squashed(c) for c in row] for row in table.rows] == [[squashed(c) for c in row] for row in rows]
    else:  # each column, read top to bottom, holds its values in order
        for column in range(len(headers)):
            assert squashed("".join(c[column] for c in table.rows)) == squashed("".join(r[column] for r in rows))


def assert_fits(text: str, width: int) -> None:
    wide = [line for line in text.splitlines() if cell_len(line.rstrip()) > width]
    assert not wide, f"{len(wide)} lines over {width} columns, first: {wide[0]!r}"


def rendered(render, value, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    render(value, console)
    return console.export_text()


# ------------------------------------------------------------------------------ the reports

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("width")


def _saved(model: onnx.ModelProto, folder, name: str) -> str:
    path = folder / name
    onnx.save(model, path)
    return str(path)


@pytest.fixture(scope="module")
def llama(model_dir) -> str:
    """Seven kinds of fusion at ort-cpu, pass names up to 31 characters, figures with notes
    ("+4 of unknown size"), a Rest row: the table that lost its Pattern column at 80."""
    return _saved(llama_attention_model(), model_dir, "llama.onnx")


@pytest.fixture(scope="module")
def decoder(model_dir) -> str:
    """A decoder step as torch's dynamo exporter writes it, with near-misses of five kinds."""
    return _saved(llama_attention_model(dynamo=True, tables="uneven", scale="div", cache="past"), model_dir,
                  "decoder.onnx")


REPORTS = {
    "llama": lambda paths: api.optimize(paths["llama"], FuseConfig(target="ort-cpu"), dry_run=True).report,
    "decoder": lambda paths: api.optimize(paths["decoder"], FuseConfig(target="ort-cpu"), dry_run=True).report,
    "transformer": lambda paths: api.optimize(SAMPLES / "transformer_block_opset14.onnx",
                                              FuseConfig(target="ort-cpu"), dry_run=True).report,
    "cnn": lambda paths: api.optimize(SAMPLES / "cnn_bn_relu.onnx", FuseConfig(dims={"batch": 8}), dry_run=True).report,
}


@pytest.fixture(scope="module")
def reports(llama, decoder):
    paths = {"llama": llama, "decoder": decoder}
    return {name: build(paths) for name, build in REPORTS.items()}


def savings_cells(row: tuple[str, ...]) -> list[str]:
    return [f"{row[0]} {row[1]}", *row[2:]]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(REPORTS))
def test_each_report_table_holds_its_values_under_its_headers(reports, name, width):
    report = reports[name]
    text = rendered(render_rich, report, width)
    assert_fits(text, width)
    savings, *others = parsed_tables(text)
    tables = {t.title: t for t in others}
    rows = savings_rows(report)
    assert_columns_hold(savings, ["Pattern / pass", "Count", "Nodes removed", "Tensors removed", "Memory saved",
                                  "Peak change"], [savings_cells(r) for r in rows], by_row=True)
    assert savings.rows[-1][0] == "Total" and savings.rows[-1][1] == str(sum(r.count for r in report.rows()))
    if report.near_misses:
        groups = near_miss_groups(report)
        expected = [(p, str(len(items)), " -> ".join(items[0].nodes), short_dims_in(items[0].reason))
                    for p, items in groups[:20]]
        assert_columns_hold(tables[f"Not fused ({len(report.near_misses)})"],
                            ["Pattern", "Count", "Nodes (first)", "Why not (first)"], expected, by_row=False)
    largest = tables["Largest activations (after fusion)"]
    assert_columns_hold(largest, ["Tensor", "Produced by", "Size"],
                        [(t.name, t.producer, human_bytes(t.nbytes)) for t in report.memory.after.largest],
                        by_row=False)


def test_the_llama_table_keeps_the_rows_that_went_missing(reports):
    """The issue's case: at 80 the Rest and Total labels vanished and Count stood empty."""
    report = reports["llama"]
    assert any(r[0].startswith("Rest:") for r in savings_rows(report)), "the model no longer makes a Rest row"
    assert max(len(r.pass_name) for r in report.rows()) > 24, "the model no longer has a long pass name"
    for width in WIDTHS:
        (savings, *_) = parsed_tables(rendered(render_rich, report, width))
        labels = [squashed(row[0]) for row in savings.rows]
        assert squashed("Rest: folded weights, new operators' buffers and scratch") in labels
        assert labels[-1] == "Total" and all(row[1] for row in savings.rows if not row[0].startswith("Rest"))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_cli_renders_at_the_width_columns_gives_a_log(llama, width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    result = CliRunner().invoke(cli, ["report", llama, "--target", "ort-cpu"])
    assert result.exit_code == 0, result.output
    assert_fits(result.stdout, width)
    tables = parsed_tables(result.stdout)
    assert tables[0].rows[-1][0] == "Total" and tables[0].headers[0] == "Pattern / pass"
    assert max(len(line.rstrip()) for line in result.stdout.splitlines()) > width - 10  # the width was used


@pytest.mark.parametrize("width", WIDTHS)
def test_verify_table_holds_its_values(model_dir, llama, width):
    fused = model_dir / "llama.fused.onnx"
    if not fused.exists():
        api.optimize(llama, FuseConfig(target="ort-cpu", verify=False), fused)
    result = verify_models(llama, str(fused), dims={}, seed=0)
    text = rendered(render_verify_rich, result, width)
    assert_fits(text, width)
    (table,) = parsed_tables(text)
    expected = [(o.name, f"{'x'.join(map(str, o.shape)) or 'scalar'} {o.dtype}",
                 f"{o.max_abs_diff:.3g} / {o.max_rel_diff:.3g}", f"{o.cosine_similarity:.6f}",
                 f"{o.atol:g} / {o.rtol:g}", "ok") for o in result.outputs]
    assert_columns_hold(table, ["Output", "Shape, dtype", "Max abs / rel diff", "Cosine", "atol / rtol", "Result"],
                        expected, by_row=False)


@pytest.mark.parametrize("width", WIDTHS)
def test_batch_table_holds_its_values(model_dir, width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    models = [SAMPLES / "cnn_bn_relu.onnx", SAMPLES / "mlp.onnx"]
    result = CliRunner().invoke(cli, ["report", *map(str, models), "-j", "1", "--json", str(model_dir / "b.json")])
    assert result.exit_code == 0, result.output
    assert_fits(result.stdout, width)
    (table,) = parsed_tables(result.stdout)
    data = json.loads((model_dir / "b.json").read_text())["models"]
    expected = [(m["model"], "ok", f"{m['report']['nodes']['before']} -> {m['report']['nodes']['after']}",
                 human_bytes(sum(f["removed_bytes"] for f in m["report"]["fusions"])),
                 " -> ".join(human_bytes(m["report"]["memory"]["peak_bytes"][k]) for k in ("before", "after")),
                 "dry run") for m in data]
    assert_columns_hold(table, ["Model", "Result", "Nodes", "Memory saved", "Peak before -> after", "Output / error"],
                        expected, by_row=False)


@pytest.fixture(scope="module")
def mlp_bench():
    return bench(SAMPLES / "mlp.onnx", providers=("CPU",), levels=("disabled",), timing=QUICK, measure_memory=False)


def test_bench_is_a_table_at_120_and_stacked_blocks_at_80(mlp_bench):
    rows = bench_table_rows(mlp_bench)
    wide = rendered(render_bench_rich, mlp_bench, 120)
    assert_fits(wide, 120)
    (table,) = parsed_tables(wide)
    assert_columns_hold(table, ["Run", "Session", "Wall ms", "CPU ms", "Runs", "Peak", *BENCH_HEADERS[8:]],
                        [(f"{r[0]}, {r[1]} {r[2]}", *r[3:]) for r in rows], by_row=False)
    narrow = rendered(render_bench_rich, mlp_bench, 80)
    assert_fits(narrow, 80)
    assert not parsed_tables(narrow)
    flat = " ".join(narrow.split())
    headers = ["Session", "Wall ms", "CPU ms", "Runs", "Peak", *BENCH_HEADERS[8:]]
    for row in rows:  # each figure right after its header
        assert " ".join(f"{h} {v}" for h, v in zip(headers, row[3:])) in flat.replace(";", "")


@pytest.mark.parametrize("width", WIDTHS)
def test_passes_fit_and_every_name_stays_whole(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    result = CliRunner().invoke(cli, ["passes", "--target", "ort-cpu"])
    assert result.exit_code == 0, result.output
    assert_fits(result.stdout, width)
    tables = parsed_tables(result.stdout)
    if tables:  # a table: the Pass column holds each name whole, one a line
        assert tables[0].headers[:3] == ["Pass", "Default", "Min opset"]
        assert set(REGISTRY) <= set(tables[0].rows[0][0].split())
    else:  # stacked: each name heads its block
        assert set(REGISTRY) <= {line.strip() for line in result.stdout.splitlines()}
    assert width == 80 or tables, "120 columns hold the passes as a table"


# ------------------------------------------------------------------------------ the planner

def test_no_width_collapses_a_column_to_nothing(reports):
    """From 30 to 200 columns: a table whose every column keeps at least its minimum, or the
    rows stacked; never a column narrower than its header's longest word."""
    report = reports["llama"]
    rows = [savings_cells(r) for r in savings_rows(report)]
    columns = (Column("Pattern / pass", weight=2), *(Column(h, figure=True) for h in
                                                     ("Count", "Nodes removed", "Tensors removed", "Memory saved",
                                                      "Peak change")))
    texts = [[Text(c) for c in row] for row in rows]
    seen_table = seen_stacked = False
    for width in range(30, 201):
        widths = plan_widths(columns, texts, width)
        text = rendered(lambda _, console: console.print(fitted_table(columns, rows, console.width)), None, width)
        assert_fits(text, width)
        if widths is None:
            seen_stacked = True
            assert "Total" in text and not parsed_tables(text)
            continue
        seen_table = True
        assert sum(widths) + 3 * len(widths) + 1 <= width
        assert all(w >= max(len(word) for word in c.header.split()) for w, c in zip(widths, columns))
        assert_columns_hold(parsed_tables(text)[0], [c.header for c in columns], rows, by_row=False)
    assert seen_table and seen_stacked


# ------------------------------------------------------------------------------ dims

def _strided(levels: int) -> onnx.ModelProto:
    """Pools with the dims torch writes on their outputs: `floor(height/2 - 1/2) + 1`, nested."""
    height, width = "height", "width"
    nodes, value_info, x = [], [], "x"
    for i in range(levels):
        height, width = f"floor({height}/2 - 1/2) + 1", f"floor({width}/2 - 1/2) + 1"
        nodes.append(helper.make_node("MaxPool", [x], [f"p{i}"], kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 1, 1, 1], name=f"pool{i}"))
        value_info.append(helper.make_tensor_value_info(f"p{i}", TensorProto.FLOAT, [1, 3, height, width]))
        x = f"p{i}"
    nodes.append(helper.make_node("Relu", [x], ["y"], name="relu"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "width"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, height, width])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_nested_floor_dims_print_shortened_on_one_line(model_dir):
    path = _saved(_strided(40), model_dir, "strided.onnx")
    report = api.optimize(path, FuseConfig(), dry_run=True).report
    longest = max(report.unbound_dims + tuple(k for k, _ in report.dims), key=len)
    assert len(longest) > 500, "the model no longer declares a long dim"
    for width in WIDTHS:
        text = rendered(render_rich, report, width)
        assert_fits(text, width)
        assert longest not in text and longest[:DIM_HEAD] in text
        assert f"a {len(longest):,}-character expression of height" in " ".join(text.split())


def test_short_dim_keeps_short_names_and_says_what_a_long_one_holds():
    assert short_dim("floor(height/2 - 1/2) + 1") == "floor(height/2 - 1/2) + 1"
    name = "floor(" * 20 + "h" + "/2)" * 20 + " + w"
    assert short_dim(name) == f"{name[:40]}… (a {len(name)}-character expression of h, w)"


def test_short_dims_in_shortens_each_expression_of_a_sentence_once():
    long = "floor(" * 12 + "height/2 - 1/2)" + " + 1)" * 11 + " + 1"
    text = f"dims {long}, batch and {long}=1 (bind them)"
    once = short_dims_in(text)
    assert once == f"dims {short_dim(long)}, batch and {short_dim(long)}=1 (bind them)"
    assert short_dims_in(once) == once
    assert short_dims_in("floor(h/2) + 1 and max(a, b) (floor(x") == "floor(h/2) + 1 and max(a, b) (floor(x"


def test_only_graph_input_dims_are_offered_for_binding(reports):
    """onnx's unk__N placeholders inside the graph are taken as 1 like the inputs' dims, but no
    option binds them: the report says so and never suggests --dim for them."""
    report = reports["llama"]
    inner = [d for d in report.unbound_dims if d.startswith("unk__")]
    assert inner, "the model no longer has dims shape inference cannot size"
    text = " ".join(rendered(render_rich, report, 200).split())
    offered = re.search(r"Symbolic dims taken as 1 for the estimate: (.*?) \(bind them", text).group(1)
    assert offered.split(", ") == [d for d in report.unbound_dims if d in report.input_dims] == ["batch", "sequence"]
    also = re.search(r"Also taken as 1: (\d+) dims inside the graph .*?\((.*?)\); no graph input has them", text)
    assert int(also.group(1)) == len(inner) and also.group(2).split(", ") == inner
    bound = re.search(r"Bound dims: (.*?) Verified", text).group(1)
    assert not any(d in bound for d in inner)
