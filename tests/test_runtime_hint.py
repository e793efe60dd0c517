"""A --target onnx audit says what an onnxruntime target would add: the cost of portability."""

from fuse_cli import api
from fuse_cli.config import FuseConfig
from tests.conftest import SAMPLES


def test_onnx_audit_counts_what_ort_would_fuse_in_addition():
    report = api.optimize(SAMPLES / "cnn_bn_relu.onnx", FuseConfig(verify=False), dry_run=True).report
    # conv1, conv2 and the depthwise conv are each followed (after BN folding) by a Relu, which
    # FusedConv takes on CPU and CUDA alike; conv4's Clip has no CUDA FusedConv mode, so `ort`
    # (both providers) leaves it.
    assert dict(report.runtime_target_would_add) == {"Conv (+ Add) + activation -> FusedConv": 3}
    assert not any(f.pass_name == "fused-conv" for f in report.fusions)  # the onnx output has none


def test_a_runtime_target_run_reports_no_such_hint():
    report = api.optimize(SAMPLES / "cnn_bn_relu.onnx", FuseConfig(target="ort", verify=False), dry_run=True).report
    assert report.runtime_target_would_add == ()
