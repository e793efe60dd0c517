"""A --target onnx audit says what an onnxruntime target would add: the cost of portability."""

from fuse_cli import api
from fuse_cli.config import FuseConfig
from tests.conftest import SAMPLES, saved_by_onnxruntime


def test_onnx_audit_counts_what_ort_would_fuse_in_addition():
    report = api.optimize(SAMPLES / "transformer_block_opset17.onnx", FuseConfig(verify=False), dry_run=True).report
    # `ort` (CPU and CUDA alike) takes the attention and the Erf GELU; its FusedConv is declined
    # (slower on CUDA), so the CNN sample would gain nothing.
    assert dict(report.runtime_target_would_add) == {"multi-head attention -> MultiHeadAttention": 1,
                                                     "Erf GELU -> com.microsoft Gelu": 1}
    assert not any(f.pass_name == "attention" for f in report.fusions)  # the onnx output has none
    cnn = api.optimize(SAMPLES / "cnn_bn_relu.onnx", FuseConfig(verify=False), dry_run=True).report
    assert cnn.runtime_target_would_add == ()


def test_a_runtime_target_run_reports_no_such_hint():
    report = api.optimize(SAMPLES / "cnn_bn_relu.onnx", FuseConfig(target="ort", verify=False), dry_run=True).report
    assert report.runtime_target_would_add == ()


def test_an_ort_cpu_transformer_output_says_to_run_it_without_the_online_optimizer(tmp_path):
    """The note's premise is checked here too: at level all onnxruntime itself turns the
    output's Add + LayerNormalization into SkipLayerNormalization (slow on CPU in 1.31), where
    pin-residual-dims did not tell the operands apart (here: left out)."""
    import collections

    import onnx

    source = SAMPLES / "transformer_block_opset17.onnx"
    out = tmp_path / "fused.onnx"
    config = FuseConfig(target="ort-cpu", verify=False, disable=("pin-residual-dims",))
    report = api.optimize(source, config, out).report
    assert any("graph optimizations at basic or disabled" in note for note in report.notes)
    saved = saved_by_onnxruntime(onnx.load(out), tmp_path, "all")
    assert collections.Counter(n.op_type for n in saved.graph.node)["SkipLayerNormalization"] > 0
    onnx_report = api.optimize(source, FuseConfig(target="onnx", verify=False), tmp_path / "o.onnx").report
    assert not any("graph optimizations at basic" in note for note in onnx_report.notes)
    pinned = api.optimize(source, FuseConfig(target="ort-cpu", verify=False), tmp_path / "p.onnx").report
    assert not any("graph optimizations at basic" in note for note in pinned.notes)
