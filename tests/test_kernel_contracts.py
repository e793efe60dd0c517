"""Every form of an operator fuse emits (fuse_cli/kernel_contracts.py) against the installed
onnxruntime: one-node models run in the worker process, so a crash is a failed probe, not a dead
pytest worker. An optional input left empty must give what its neutral value gives; float16 what
float32 gives on the same values, at float16's tolerance; a refused form must still fail (if the
runtime now runs it, the table is out of date)."""

import numpy as np
import onnx
import pytest
from onnx import helper

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.core import isolation, model_runs
from fuse_cli.core.isolation import RuntimeCrash
from fuse_cli.core.sessions import Source
from fuse_cli.errors import FuseError
from fuse_cli.kernel_contracts import CONTRACTS, MS, SPECS, Contract, refused_forms
from fuse_cli.passes import REGISTRY
from fuse_cli.targets import capability_rows
from tests.test_crash_isolation import bert_without_biases

def probe_model(contract: Contract, dtype: str, neutral: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    """The one-node model of `contract`'s form at `dtype`, and seeded feeds. `neutral`: its absent
    inputs given their neutral value (zeros) instead, where they have one (a shape)."""
    spec = SPECS[(contract.op, contract.domain)]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    rng = np.random.default_rng(0)
    names, values, feeds = [], [], {}
    for inp in spec.inputs:
        absent = inp.name in contract.absent or (inp.optional and not inp.shape)
        if absent and not (neutral and inp.shape):
            names.append("")
            continue
        if absent:
            value = np.zeros(inp.shape, inp.integer_dtype if inp.integers is not None else dtype)
        elif inp.integers is not None:
            value = np.asarray(rng.integers(*inp.integers, inp.shape), inp.integer_dtype)
        else:
            value = (rng.standard_normal(inp.shape) * 0.5).astype(dtype)
        names.append(inp.name)
        feeds[inp.name] = value
        values.append(helper.make_tensor_value_info(inp.name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                    value.shape))
    while names[-1] == "":
        names.pop()
    node = helper.make_node(contract.op, names, ["y"], domain=contract.domain, **spec.attrs)
    out = helper.np_dtype_to_tensor_dtype(np.dtype(spec.output_dtype)) if spec.output_dtype else elem
    graph = helper.make_graph([node], "probe", values, [helper.make_tensor_value_info("y", out, None)])
    opsets = [helper.make_opsetid("", spec.opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString(), feeds


def run(model: bytes, feeds: dict[str, np.ndarray]) -> np.ndarray | str:
    """The output, or what went wrong: a crash or onnxruntime's refusal, in words."""
    try:
        _, outputs = isolation.call(model_runs.reference_run, Source(model), {}, feeds=feeds)
    except RuntimeCrash as crash:
        return str(crash)
    except FuseError as error:
        return str(error)
    return outputs["y"]


def probe(contract: Contract) -> str | None:
    """None when the form runs and agrees with its reference; else what the probe found."""
    got = run(*probe_model(contract, contract.dtype, neutral=False))
    if isinstance(got, str):
        return got
    if not np.isfinite(got).all():
        return "its output is not finite"
    if contract.dtype != "float32" and np.dtype(contract.dtype).kind == "f":
        model, feeds = probe_model(contract, "float32", neutral=False)
        want = run(model, {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in feeds.items()})
        rtol, atol = 1e-2, 1e-2
    elif any(i.name in contract.absent and i.shape for i in SPECS[(contract.op, contract.domain)].inputs):
        want = run(*probe_model(contract, contract.dtype, neutral=True))
        rtol, atol = 1e-5, 1e-5
    else:
        return None  # every input present at float32: each pass's own tests check what it computes
    if isinstance(want, str):
        return f"its reference fails: {want}"
    if want.shape != got.shape or not np.allclose(got.astype(np.float32), want, rtol=rtol, atol=atol):
        return f"it differs from its reference by {np.abs(got.astype(np.float32) - want).max():.3g}"
    return None


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.label)
def test_each_form_behaves_as_the_table_says(contract):
    found = probe(contract)
    if contract.refused is None:
        assert found is None, f"{contract.label}: {found}"
    else:
        assert found is not None, f"{contract.label} now runs and agrees: update kernel_contracts.py"


def test_the_bias_free_attention_is_refused_because_it_crashes():
    (form, *_) = refused_forms("Attention", MS)
    assert probe(form) == "onnxruntime crashed (SIGSEGV)"


def test_every_emitted_operator_is_probed_and_every_probe_names_real_passes():
    emitted = {tuple(reversed(q.rpartition("::")[::2])) for p in REGISTRY.values() for q in getattr(p, "emits", ())}
    emitted = {(op, "" if domain in ("", "ai.onnx") else domain) for op, domain in emitted}
    probed = {(c.op, c.domain) for c in CONTRACTS}
    assert emitted <= probed
    assert {name for c in CONTRACTS for name in c.emitted_by} <= set(REGISTRY)


def test_packed_attention_never_writes_the_refused_bias_free_form(tmp_path):
    path = tmp_path / "bert.onnx"
    onnx.save(bert_without_biases(), path)
    config = FuseConfig(passes=("eliminate-noop-arith", "attention", "packed-attention"), target="ort-cpu",
                        allow_peak_growth=True)
    report = api.optimize(path, config, tmp_path / "out.onnx").report
    assert report.verification.passed and not report.rolled_back
    (node,) = [n for n in onnx.load(tmp_path / "out.onnx").graph.node if n.op_type == "Attention"]
    assert len(node.input) > 2 and node.input[2], "a bias input, zeros"


def test_the_target_table_names_the_refused_forms():
    (row,) = [r for r in capability_rows("ort-cpu") if r[0] == "Attention" and r[1] == MS]
    assert "not emitted: onnxruntime-gpu 1.31.1's CPU kernel crashes (SIGSEGV) without its bias input" in row[-1]
