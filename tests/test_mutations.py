"""The mutation suite: every deliberately wrong rewrite of tests/mutations.py, applied to the
samples, a light-zoo model and small graphs where its pass fires, must be caught by verification
(exit 1, the pass named, its rewrites rolled back). The catch rate is printed at the end of the
test run (tests/conftest.py)."""

from __future__ import annotations

import onnx
import pytest

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.passes import REGISTRY
from tests.conftest import LIGHT_MODELS, SAMPLES
from tests.mutations import MUTATIONS
from tests.graphs import GraphBuilder
from tests.llama_graphs import llama_attention_model
from tests.test_pass_fused_conv import conv
from tests.test_pass_fused_matmul import attention_scores
from tests.test_pass_pad_conv import pad_conv
from tests.test_pass_transposes import transposes
from tests.test_verify import conv_bn_model

pytestmark = pytest.mark.slow

def conv_residual_relu():
    b = GraphBuilder()
    x, z = b.input("x", ["batch", 3, 8, 8]), b.input("z", ["batch", 4, 8, 8])
    return b.build(b.op("Relu", b.op("Add", conv(b, x, pads=[1, 1, 1, 1]), z)), output_names=["y"])


BUILT = {
    "conv_residual_relu": conv_residual_relu,
    "conv_bn_tiny_var": conv_bn_model,
    "transpose_chain": lambda: transposes([0, 2, 1, 3], [0, 1, 3, 2]),
    "pad_conv": lambda: pad_conv([0, 0, 1, 1, 0, 0, 1, 1]),
    "attention_scores": lambda: attention_scores(GraphBuilder()),
    "llama_attention": llama_attention_model,
    "llama_decode_step": lambda: llama_attention_model(cache="past"),
}


def model_path(name: str, tmp_path):
    if name in BUILT:
        path = tmp_path / f"{name}.onnx"
        onnx.save(BUILT[name](), path)
        return path
    sample = SAMPLES / f"{name}.onnx"
    return sample if sample.exists() else LIGHT_MODELS / f"{name}.onnx"


def test_at_least_25_mutations():
    assert len(MUTATIONS) >= 25 and len({m.name for m in MUTATIONS}) == len(MUTATIONS)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_verification_catches_the_mutation(tmp_path, monkeypatch, record_property, mutation):
    mutant = mutation.make_pass()
    monkeypatch.setitem(REGISTRY, mutant.name, mutant)
    fired = 0
    for name in mutation.models:
        type(mutant).applied = 0
        out = tmp_path / f"{name}.out.onnx"
        # the peak guard may leave a mutant out before verification sees it: this suite is about verification
        config = FuseConfig(target=mutation.target, passes=mutation.first + (mutant.name,), allow_peak_growth=True)
        report = api.optimize(model_path(name, tmp_path), config, out).report
        if not type(mutant).applied:
            continue
        fired += 1
        record_property("mutation", f"{mutation.name} on {name}")
        assert report.exit_code == 1, f"{mutation.mistake} on {name} passed verification"
        assert [r.pass_name for r in report.rolled_back] == [mutant.name]
        assert report.verification.passed, "the model written without the mutant's rewrites verifies"
    assert fired, f"{mutation.name} fired on none of its models"
