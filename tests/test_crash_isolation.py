"""A runtime crash is a verification result, never fuse's death: onnxruntime runs in a worker
process (core/isolation.py). The crash used is a real one: onnxruntime-gpu 1.31.1's CPU
com.microsoft Attention without its bias input segfaults (FACTS.md); where the installed runtime
runs it, those tests skip."""

import os
import subprocess
import sys

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.core import isolation, model_runs, sessions
from fuse_cli.core.isolation import RuntimeCrash
from fuse_cli.graph.edit import Replacement
from fuse_cli.passes import REGISTRY
from fuse_cli.passes.packed_attention import PackQkvAttention
from fuse_cli.verify import MISMATCH, UNVERIFIABLE, verify_models
from tests.attention_graphs import attention_model
from tests.graphs import GraphBuilder, op_counts

HIDDEN, HEADS = 8, 2


def packed_attention(bias: bool) -> onnx.ModelProto:
    """One com.microsoft Attention over [batch, sequence, 8]; `bias`: a zero bias input, else none."""
    b = GraphBuilder(extra_opsets={"com.microsoft": 1})
    x = b.input("x", ["batch", "sequence", HIDDEN])
    inputs = [x, b.const(b.rand(HIDDEN, 3 * HIDDEN))] + ([b.const(np.zeros(3 * HIDDEN, np.float32))] if bias else [])
    model = b.build(b.op("Attention", *inputs, domain="com.microsoft", num_heads=HEADS), output_names=["y"])
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return model


@pytest.fixture(scope="module")
def bias_free_attention_crashes():
    try:
        isolation.call(model_runs.reference_run, sessions.source_of(packed_attention(bias=False)),
                       {"batch": 2, "sequence": 3})
    except RuntimeCrash:
        return
    pytest.skip(f"onnxruntime {__import__('onnxruntime').__version__} runs the bias-free Attention")


def test_a_worker_that_aborts_raises_a_crash_and_the_next_call_gets_a_fresh_worker():
    before = isolation.call(os.getpid)
    with pytest.raises(RuntimeCrash) as crash:
        isolation.call(os.abort)
    assert str(crash.value) == "onnxruntime crashed (SIGABRT)"
    after = isolation.call(os.getpid)
    assert after not in (before, os.getpid())


def test_an_exception_in_the_worker_comes_back_as_itself():
    with pytest.raises(ValueError, match="invalid literal"):
        isolation.call(int, "seven")


def test_a_candidate_that_crashes_onnxruntime_is_a_mismatch_with_the_reason(bias_free_attention_crashes):
    result = verify_models(packed_attention(bias=True), packed_attention(bias=False))
    assert result.status == MISMATCH
    assert result.reason == "onnxruntime crashed (SIGSEGV) running the candidate"
    assert verify_models(packed_attention(bias=True), packed_attention(bias=True)).passed, "the worker came back"


def test_an_original_that_crashes_onnxruntime_is_unverifiable(bias_free_attention_crashes):
    result = verify_models(packed_attention(bias=False), packed_attention(bias=True))
    assert result.status == UNVERIFIABLE
    assert result.reason.startswith("the original model cannot run at ")
    assert result.reason.endswith(": onnxruntime crashed (SIGSEGV)")


class DropsAttentionBias(PackQkvAttention):
    """Test-only: packed-attention as it was, leaving the bias input empty when the graph has no
    biases (which crashes onnxruntime-gpu 1.31.1's CPU kernel)."""

    name = "test-packed-attention-without-bias"

    def rewrite(self, m, g) -> Replacement:
        replacement = super().rewrite(m, g)
        if m.tensor("bias") is None:
            replacement.nodes[0].inputs[2] = gs.Variable.empty()
        return replacement


def bert_without_biases() -> onnx.ModelProto:
    """A BERT layer whose Q/K/V biases are zeros (random-init exports): eliminate-noop-arith removes them."""
    model = attention_model(opset=17, mask="padding")
    biases = {n.input[0] for n in model.graph.node if n.name in ("query_add", "key_add", "value_add")}
    for tensor in model.graph.initializer:
        if tensor.name in biases:
            zeros = np.zeros_like(onnx.numpy_helper.to_array(tensor))
            tensor.CopyFrom(onnx.numpy_helper.from_array(zeros, tensor.name))
    return model


def test_a_pass_whose_output_crashes_onnxruntime_is_rolled_back_and_fuse_goes_on(
        tmp_path, monkeypatch, bias_free_attention_crashes):
    monkeypatch.setitem(REGISTRY, DropsAttentionBias.name, DropsAttentionBias())
    path = tmp_path / "bert.onnx"
    onnx.save(bert_without_biases(), path)
    config = FuseConfig(passes=("eliminate-noop-arith", "attention", DropsAttentionBias.name), target="ort-cpu",
                        allow_peak_growth=True)
    report = api.optimize(path, config, tmp_path / "out.onnx").report
    (rolled,) = report.rolled_back
    assert rolled.pass_name == DropsAttentionBias.name
    assert rolled.reason == "onnxruntime crashed (SIGSEGV) running the candidate"
    assert report.verification.passed and report.exit_code == 1
    counts = op_counts(onnx.load(tmp_path / "out.onnx"))
    assert counts["com.microsoft::MultiHeadAttention"] == 1 and counts["com.microsoft::Attention"] == 0


def test_fuse_verify_reports_a_crashing_candidate_and_exits_1(tmp_path, bias_free_attention_crashes):
    onnx.save(packed_attention(bias=True), tmp_path / "a.onnx")
    onnx.save(packed_attention(bias=False), tmp_path / "b.onnx")
    done = subprocess.run([sys.executable, "-m", "fuse_cli", "verify", str(tmp_path / "a.onnx"),
                           str(tmp_path / "b.onnx")], capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr
    assert "onnxruntime crashed (SIGSEGV) running the candidate" in " ".join((done.stdout + done.stderr).split())


def test_fuse_bench_and_the_measurement_say_onnxruntime_crashed(tmp_path, bias_free_attention_crashes):
    from fuse_cli.analysis.measure import measure_peak
    from fuse_cli.bench import QUICK, bench
    from fuse_cli.errors import FuseError

    onnx.save(packed_attention(bias=True), tmp_path / "a.onnx")
    onnx.save(packed_attention(bias=False), tmp_path / "b.onnx")
    with pytest.raises(FuseError, match=r"^onnxruntime crashed \(SIGSEGV\) timing the models on CPU"):
        bench(tmp_path / "a.onnx", tmp_path / "b.onnx", dims={"batch": 1, "sequence": 4}, levels=("disabled",),
              timing=QUICK, measure_memory=False)
    measured = measure_peak(tmp_path / "b.onnx", dims={"batch": 1, "sequence": 4})
    assert measured.peak_bytes is None and measured.reason == "onnxruntime crashed (SIGSEGV) running it"


def test_weights_held_by_reference_reach_the_worker_as_references(tmp_path):
    from fuse_cli.graph.io import read_original

    b = GraphBuilder()
    model = b.build(b.op("MatMul", b.input("x", [1, 512]), b.const(b.rand(512, 512))), output_names=["y"])
    onnx.save(model, tmp_path / "m.onnx")
    source = sessions.source_of(read_original(tmp_path / "m.onnx"))
    assert len(source.model) < 1024 and source.external_folder == str(tmp_path.resolve())
    assert verify_models(str(tmp_path / "m.onnx"), read_original(tmp_path / "m.onnx")).passed


def test_a_constant_subgraph_that_crashes_onnxruntime_stays_unfolded_and_fuse_goes_on(
        tmp_path, bias_free_attention_crashes):
    """graphsurgeon's folder runs constant subgraphs in onnxruntime: in a worker process, so the
    crashing bias-free Attention over constants is a subgraph left as it is, not fuse's death;
    the other constant subgraph still folds."""
    b = GraphBuilder(extra_opsets={"com.microsoft": 1})
    x = b.input("x", [2, 3, HIDDEN])
    crashing = b.op("Attention", b.const(b.rand(2, 3, HIDDEN)), b.const(b.rand(HIDDEN, 3 * HIDDEN)),
                    domain="com.microsoft", num_heads=HEADS)
    folded = b.op("Mul", b.const(b.rand(HIDDEN)), b.const(np.float32(2.0)))
    model = b.build(b.op("Add", b.op("Add", x, crashing), folded), output_names=["y"])
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    done = subprocess.run([sys.executable, "-m", "fuse_cli", "optimize", str(path), "-o", str(tmp_path / "out.onnx"),
                           "--passes", "fold-constants", "--no-verify"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    counts = op_counts(onnx.load(tmp_path / "out.onnx"))
    assert counts["com.microsoft::Attention"] == 1 and counts["Mul"] == 0
