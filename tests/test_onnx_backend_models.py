"""Every model of onnx's own backend test data (shipped in the onnx package: PyTorch-converted
layers, PyTorch operators, sequence/string/training models) goes through `fuse optimize`: fuse
never crashes, and wherever onnxruntime can run the original the output matches it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from fuse_cli import api
from fuse_cli.config import FuseConfig

pytestmark = pytest.mark.slow

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
MODELS = sorted(p for kind in ("pytorch-converted", "pytorch-operator", "simple")
                for p in (DATA / kind).glob("*/model.onnx"))


def test_the_onnx_package_still_ships_them():
    assert len(MODELS) >= 100


@pytest.mark.parametrize("path", MODELS, ids=[p.parent.name for p in MODELS])
def test_fuse_keeps_the_outputs_or_says_why_it_could_not_check(tmp_path, path):
    report = api.optimize(path, FuseConfig(target="ort-cpu"), tmp_path / "out.onnx").report
    result = report.verification
    assert (tmp_path / "out.onnx").is_file()
    assert not report.rolled_back, "a pass broke a model"
    if result.status == "unverifiable":
        # onnxruntime cannot run the original itself: opsets it dropped, string inputs, ...; never
        # a model whose optimized form failed where the original ran (that is a mismatch)
        assert result.reason.startswith("the original model cannot run")
        assert report.exit_code == 0
        required = api.optimize(path, FuseConfig(target="ort-cpu", require_verified=True), tmp_path / "req.onnx")
        assert required.report.exit_code == 1 and "--require-verified" in required.report.failures[0]
        return
    assert result.status == "match", (result.status, result.reason)
