"""Shared test helpers: run passes on an in-memory model and check it numerically."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.verify import verify_models

REPO = Path(__file__).resolve().parents[1]


def benchmark_script(stem: str, module_name: str | None = None):
    """benchmarks/<stem>.py as a module (the folder is not a package). Registered in sys.modules
    before it runs: its dataclasses look their module up while the file executes."""
    import importlib.util
    import sys

    name = module_name or stem
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
SAMPLES = REPO / "sample_models"
LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def optimize_model(model: onnx.ModelProto, tmp_path: Path, *, name: str = "model", **config) -> api.OptimizeResult:
    """Save `model`, run fuse on it with the given FuseConfig fields, return the result."""
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    config.setdefault("verify", False)  # tests compare outputs themselves; rollback would hide bugs
    # a pass's own tests see its rewrites; the peak guard, a policy over whole models, has its own
    config.setdefault("allow_peak_growth", True)
    return api.optimize(path, FuseConfig(**config), tmp_path / f"{name}.out.onnx")


def assert_equivalent(original: onnx.ModelProto, optimized: onnx.ModelProto, *, dims=None, seeds=(0, 1),
                      rtol=None, atol=None) -> None:
    """Outputs match in onnxruntime CPU through the same verify code the CLI uses."""
    for seed in seeds:
        result = verify_models(original, optimized, dims=dims, seed=seed, rtol=rtol, atol=atol)
        assert result.passed, [o for o in result.outputs if not o.passed]


def assert_one_norm_with_float32_stash(model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    """The float16 norm became one node on `x` computing in float32 (stash_type 1, as torch's
    widened float16 exports do), within float16's rounding of the original at two settings."""
    (node,) = fused.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert node.input[0] == "x" and attrs["stash_type"] == 1
    for dims in ({"batch": 1, "sequence": 3}, {"batch": 3, "sequence": 5}):
        assert_equivalent(model, fused, dims=dims, rtol=1e-2, atol=1e-3)


def fused_and_settled(model: onnx.ModelProto, tmp_path: Path, passes: tuple[str, ...], settings,
                      rerun: tuple[str, ...] | None = None) -> api.OptimizeResult:
    """fuse with `passes`; the output must match the original at each of `settings` (dims) and a
    second run of `rerun` (default: the same passes) on it must fuse nothing."""
    result = optimize_model(model, tmp_path, passes=passes)
    for dims in settings:
        assert_equivalent(model, result.model, dims=dims)
    assert not optimize_model(result.model, tmp_path, name="again", passes=rerun or passes).report.fusions
    return result


@pytest.fixture(autouse=True)
def _quiet_onnxruntime():
    os.environ.setdefault("ORT_LOGGING_LEVEL", "3")
    yield


@pytest.fixture(autouse=True)
def _a_logs_width(monkeypatch):
    """The command line renders as in a CI log (120 columns): pytest-xdist's workers inherit
    COLUMNS=80 from execnet, a plain run none. Tests of a width set COLUMNS themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


def pytest_terminal_summary(terminalreporter):
    """The mutation suite's catch rate (tests/test_mutations.py), over every worker's reports."""
    caught = [value for report in terminalreporter.stats.get("passed", [])
              for key, value in report.user_properties if key == "mutation"]
    failed = [report for report in terminalreporter.stats.get("failed", [])
              if "test_verification_catches_the_mutation" in report.nodeid]
    if caught or failed:
        total = len(caught) + len(failed)
        terminalreporter.write_line(f"mutation suite: verification caught {len(caught)} of {total} wrong rewrites "
                                    f"({100 * len(caught) / total:.0f}%; {len(failed)} mutations not caught)")


# all-zero attention_mask: every query row masked throughout, where float16 graphs and kernels part ways
MASKED_THROUGHOUT = {"attention_mask": (0, 1), "position_ids": (0, 64)}


def assert_float16_outputs_match(original: onnx.ModelProto, fused: onnx.ModelProto, sizes) -> None:
    """A float16 decoder block within verification's own float16 tolerances (the dtype's defaults),
    at each setting of `sizes` (distinct sizes for distinct dims), with random 0/1 masks and with
    every row masked throughout."""
    for dims in sizes:
        for ranges in ({"attention_mask": (0, 2), "position_ids": (0, 64)}, MASKED_THROUGHOUT):
            result = verify_models(original, fused, dims=dims, seed=0, int_ranges=ranges)
            assert result.passed, (dims, ranges, result.outputs)


def saved_by_onnxruntime(model: onnx.ModelProto, folder: Path, level: str = "disabled") -> onnx.ModelProto:
    """The graph onnxruntime's CPU provider runs `model` as, at graph optimization `level`
    (core.sessions.LEVELS), as its session saves it (optimized_model_filepath)."""
    import onnxruntime as ort

    from fuse_cli.core.sessions import LEVELS

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    options.optimized_model_filepath = str(Path(folder) / f"saved-{level}.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)
