"""Running fuse on its own output finds nothing more to do, for every sample and target."""

import pytest

from fuse_cli import api
from fuse_cli.config import FuseConfig
from tests.conftest import SAMPLES

UPGRADE = {"transformer_block_opset14.onnx": 17, "transformer_block_opset17.onnx": 20}


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.onnx")))
def test_optimizing_the_output_again_changes_nothing(tmp_path, sample, target):
    config = FuseConfig(target=target, verify=False, upgrade_opset=UPGRADE.get(sample))
    first = api.optimize(SAMPLES / sample, config, tmp_path / "once.onnx")
    assert first.report.fusions, f"{sample}: expected something to fuse with --target {target}"
    second = api.optimize(tmp_path / "once.onnx", FuseConfig(target=target, verify=False), tmp_path / "twice.onnx")
    assert not second.report.fusions, [(f.pass_name, f.replaced) for f in second.report.fusions]
    assert len(second.model.graph.node) == len(first.model.graph.node)
