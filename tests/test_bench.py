"""`fuse bench` (fuse_cli/bench.py) and the peer comparison (benchmarks/run.py), on a sample with
few iterations. No timing is asserted: the machines this runs on are small and shared. What is
checked is that the JSON carries exactly the fields benchmarks/README.md documents."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto

from fuse_cli import api
from fuse_cli.bench import BENCH_SCHEMA_VERSION, QUICK, BenchRow, Latency, bench, usable_providers
from fuse_cli.report.bench import bench_to_json_dict, render_bench_markdown, render_bench_rich
from fuse_cli.config import FuseConfig
from fuse_cli.errors import UsageError
from tests.conftest import REPO, SAMPLES, benchmark_script
from tests.graphs import GraphBuilder

README = REPO / "benchmarks" / "README.md"
RUN = REPO / "benchmarks" / "run.py"
CNN = SAMPLES / "cnn_bn_relu.onnx"
MLP = SAMPLES / "mlp.onnx"


def documented_fields(section: str) -> set[str]:
    """The field paths in the first column of the table under README heading `section`."""
    text = README.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", body, flags=re.M)}


def field_paths(value, prefix: str = "") -> set[str]:
    """Every key path in a JSON value: `a.b` for objects, `a[].b` for lists of objects. Objects
    keyed by data (input names, dims) count as one leaf."""
    paths = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            if path not in OPEN_OBJECTS:
                paths |= field_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= field_paths(item, f"{prefix}[]")
    return paths


OPEN_OBJECTS = {"input_shapes", "models[].input_shapes", "settings.dims"}


@pytest.fixture(scope="module")
def cnn_bench():
    return bench(CNN, dims={"batch": 2}, providers=("CPU",), timing=QUICK)


def test_bench_json_has_the_documented_fields(cnn_bench):
    data = bench_to_json_dict(cnn_bench)
    assert data["schema_version"] == BENCH_SCHEMA_VERSION
    documented, present = documented_fields("`fuse bench --json`"), field_paths(data)
    assert present <= documented, present - documented
    # Only CPU was asked for, so no provider was skipped and that list is empty.
    assert documented - present == {"skipped_providers[].provider", "skipped_providers[].reason"}
    assert [(r["model"], r["provider"], r["graph_optimization"]) for r in data["rows"]] == [
        ("original", "CPU", "disabled"), ("fused", "CPU", "disabled"),
        ("original", "CPU", "all"), ("fused", "CPU", "all")]
    assert data["input_shapes"] == {"image": [2, 3, 32, 32]}
    assert data["nodes"]["fused"] < data["nodes"]["original"]
    assert data["optimized"] is None and "in memory" in data["fused_by"]
    json.dumps(data)


def test_bench_rows_carry_ratios_on_fused_rows_only(cnn_bench):
    for row in cnn_bench.rows:
        assert row.samples == QUICK.min_samples and row.runs_per_sample >= 1
        assert row.wall_median_ms > 0 and row.cpu_median_ms >= 0 and row.session_ms > 0
        if row.model == "original":
            assert (row.wall_ratio, row.cpu_ratio, row.peak_ratio, row.session_ratio) == (None, None, None, None)
        else:
            assert row.wall_ratio is not None and row.session_ratio is not None
        if (row.provider, row.graph_optimization) != ("CPU", "disabled"):
            assert row.peak_bytes is None  # measure_peak measures CPU with optimizations off only
    measured = [r for r in cnn_bench.rows if r.graph_optimization == "disabled"]
    if cnn_bench.peak_not_measured is None:
        assert all(r.peak_bytes is not None for r in measured)
    else:
        assert cnn_bench.peak_not_measured


def test_bench_renders_rich_and_markdown(cnn_bench):
    from rich.console import Console

    console = Console(record=True, width=200)
    render_bench_rich(cnn_bench, console)
    text = console.export_text()
    markdown = render_bench_markdown(cnn_bench)
    for out in (text, markdown):
        assert "original" in out and "fused" in out and "Session ×" in out
        assert "nodes 18 -> " in out


def test_bench_against_a_given_optimized_model(tmp_path):
    fused = tmp_path / "mlp.fused.onnx"
    api.optimize(MLP, FuseConfig(verify=False), fused)
    result = bench(MLP, fused, providers=("CPU",), levels=("disabled",), timing=QUICK, measure_memory=False)
    assert result.optimized == str(fused) and result.fused_by == str(fused)
    assert [r.model for r in result.rows] == ["original", "fused"]
    assert result.peak_not_measured == "not asked for"
    assert all(r.peak_bytes is None for r in result.rows)
    assert dict(result.input_shapes) == {"features": (1, 64)}  # the unbound batch dim is 1


def test_bench_rejects_unknown_providers_and_levels():
    with pytest.raises(UsageError, match="unknown provider or level 'TPU'"):
        bench(MLP, providers=("TPU",))
    with pytest.raises(UsageError, match="'some'"):
        bench(MLP, levels=("some",))


def test_cuda_is_used_only_where_a_session_really_gets_it():
    usable, skipped = usable_providers()
    assert usable[0] == "CPU"
    assert set(usable) | {name for name, _ in skipped} == {"CPU", "CUDA"}
    assert all(reason for _, reason in skipped)


def test_bench_row_fields_are_documented():
    documented = {f.removeprefix("rows[].") for f in documented_fields("`fuse bench --json`")
                  if f.startswith("rows[].")}
    assert documented == set(BenchRow.__dataclass_fields__)


# ---- benchmarks/run.py ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_module():
    yield benchmark_script("run", "benchmarks_run")
    del sys.modules["benchmarks_run"]


def test_run_quick_writes_markdown_and_json(tmp_path, run_module):
    tools = ("fuse-onnx", "onnxoptimizer", "ort-basic")
    done = subprocess.run([sys.executable, str(RUN), "--quick", "--out", str(tmp_path), "--tools", ",".join(tools),
                           str(MLP)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    markdown = (tmp_path / "latest.md").read_text(encoding="utf-8")
    data = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))
    assert data["schema_version"] == run_module.SCHEMA_VERSION
    documented, present = documented_fields("`benchmarks/run.py` JSON"), field_paths(data)
    assert present == documented, (present - documented, documented - present)
    ran = [t["name"] for t in data["tools"] if t["skipped"] is None]
    assert "fuse-onnx" in ran and "ort-basic" in ran  # the peers that do not import are skipped with a reason
    assert all(t["skipped"] for t in data["tools"] if t["name"] not in ran)
    (model,) = data["models"]
    assert model["name"] == "mlp" and model["groups"] == ["MLP / other"] and model["error"] is None
    assert model["session_ms"] > 0 and model["latency_all"]["runs"] >= 1
    assert [r["tool"] for r in model["results"]] == ["noise-floor", *ran]
    fuse_row = model["results"][1]
    assert fuse_row["error"] is None and fuse_row["nodes"] < model["nodes"]
    assert fuse_row["max_abs_diff"] is not None and fuse_row["max_abs_diff"] < 1e-4
    assert fuse_row["optimize_seconds"] > 0 and fuse_row["latency_disabled"]["runs"] >= 1
    for field in ("session_ratio", "cpu_ratio_disabled", "wall_ratio_disabled", "cpu_ratio_all", "wall_ratio_all"):
        assert fuse_row[field] > 0, field
    assert data["settings"]["graph_optimization"] == ["disabled", "all"]
    assert "| mlp | original |" in markdown and "## Geometric means by group" in markdown
    assert "| CNN opset 14 | " in markdown  # every group is listed, with "none" where no model is in it
    for tool in ran:
        assert f"| {tool} |" in markdown


def test_run_groups_models_by_their_operators(run_module):
    import onnx

    groups = {p.stem: run_module.model_groups(onnx.load(str(p), load_external_data=False))
              for p in sorted(SAMPLES.glob("*.onnx"))}
    assert groups == {"cnn_bn_relu": ("CNN with BatchNorm",), "mlp": ("MLP / other",),
                      "transformer_block_opset14": ("transformer",), "transformer_block_opset17": ("transformer",)}


def _model_of(opset: int, *ops: str):
    """Only the operators and the opset import: all model_groups reads."""
    from onnx import helper

    nodes = [helper.make_node(op, [], [f"y{i}"]) for i, op in enumerate(ops)]
    return helper.make_model(helper.make_graph(nodes, "g", [], []), opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset, ops, expected", [
    (14, ("Conv", "BatchNormalization"), ("CNN with BatchNorm", "CNN opset 14")),
    (17, ("Conv", "BatchNormalization"), ("CNN with BatchNorm",)),
    (14, ("Conv", "Relu"), ("CNN without BatchNorm", "CNN opset 14")),
    (17, ("Conv", "LayerNormalization", "MatMul"), ("CNN without BatchNorm",)),  # ConvNeXt: no attention
    (14, ("Conv", "MatMul", "Softmax"), ("transformer",)),  # ViT: its patch Conv does not make it a CNN
    (14, ("MatMul", "Relu"), ("MLP / other",)),
])
def test_run_counts_cnns_at_opset_14_in_a_second_group(run_module, opset, ops, expected):
    assert run_module.model_groups(_model_of(opset, *ops)) == expected


def test_run_group_means_count_a_model_in_each_of_its_groups(run_module):
    def model(name, groups, cpu_all):
        lat = Latency(samples=1, runs_per_sample=1, wall_median_ms=1.0, wall_p90_ms=1.0, cpu_median_ms=1.0,
                      cpu_p90_ms=1.0)
        row = run_module.ToolResult("fuse-onnx", node_ratio=0.5, latency_disabled=lat, cpu_ratio_all=cpu_all)
        return run_module.ModelResult(name, name, groups, 10, {}, None, lat, lat, None, (row,))

    models = [model("a", ("CNN with BatchNorm", "CNN opset 14"), 0.5), model("b", ("CNN with BatchNorm",), 2.0)]
    means = {g.group: g for g in run_module.group_means(models, ["fuse-onnx"])}
    assert set(means) == {"CNN with BatchNorm", "CNN opset 14", "all"}
    assert (means["CNN opset 14"].models, means["CNN opset 14"].cpu_ratio_all) == (1, pytest.approx(0.5))
    assert (means["all"].models, means["all"].cpu_ratio_all) == (2, pytest.approx(1.0))
    assert means["all"].session_ratio is None  # no model had the figure
    members = {row[0]: row[2] for row in run_module.member_rows(models)}
    assert members["CNN opset 14"] == "a" and members["CNN with BatchNorm"] == "a, b"
    assert members["transformer"] == "none" and members["all"] == "2"


def test_run_times_session_creation_and_reports_a_model_that_will_not_load(run_module, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    sessions, best_ms, refused = run_module.timed_sessions({"mlp": MLP, "broken": broken}, "all", repeats=2)
    assert set(sessions) == set(best_ms) == {"mlp"} and best_ms["mlp"] > 0
    assert set(refused) == {"broken"} and "cannot load" in refused["broken"]


def test_run_skips_a_peer_that_does_not_import(run_module, monkeypatch):
    ghost = run_module.Tool("ghost", "a peer that is not installed", "fuse_no_such_module", "fuse-no-such-dist")
    monkeypatch.setattr(run_module, "TOOLS", (*run_module.TOOLS, ghost))
    (status,) = run_module.tool_statuses(["ghost"])
    assert status.skipped.startswith("does not import (ModuleNotFoundError") and status.version is None


def test_run_geometric_means_skip_missing_figures(run_module):
    assert run_module._geomean([2.0, 0.5, None]) == pytest.approx(1.0)
    assert run_module._geomean([None]) is None


def test_bench_refuses_a_missing_model(tmp_path):
    from fuse_cli.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no such file"):
        bench(MLP, tmp_path / "missing.onnx", timing=QUICK)


def test_run_feeds_integers_in_the_ranges_the_graph_implies(tmp_path):
    """A token-type table of two rows read by an int64 input (BERT): the peer bench's inputs stay
    in range, as verification's do, so the model gets latency and peak figures, not an error."""
    b = GraphBuilder(opset=17)
    types = b.input("token_type_ids", ["batch", "sequence"], dtype=TensorProto.INT64)
    model = b.build(b.op("Relu", b.op("Gather", b.const(b.rand(2, 8)), types)), output_names=["y"])
    path = tmp_path / "types.onnx"
    onnx.save(model, path)
    done = subprocess.run([sys.executable, str(RUN), "--quick", "--out", str(tmp_path), "--tools", "fuse-onnx",
                           str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))["models"]
    assert result["error"] is None and result["latency_disabled"]["runs"] >= 1 and result["peak_bytes"] is not None
