"""No output that does not load, with or without verification: a pass that breaks loading is
dropped (--no-verify included); where the model does not load with every pass dropped, fuse
says so in one line as its own error (exit 3) and writes nothing."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import pytest

from fuse_cli import fusing, graph
from fuse_cli.graph.edit import Replacement
from fuse_cli.passes import REGISTRY
from tests.test_cli import conv_bn_model, invoke
from tests.test_control_flow_io import outer_weight_in_both_branches


@pytest.fixture
def conv_bn_writes_an_unknown_operator(monkeypatch):
    """conv-bn's rewrite replaced by one node of an operator no runtime has."""
    def rewrite(self, m, g):
        bn = m.node("bn")
        return Replacement(nodes=[gs.Node("NoSuchOperator", g.unique_name("broken"), inputs=[m.tensor("x")],
                                          outputs=list(bn.outputs))])
    monkeypatch.setattr(type(REGISTRY["conv-bn"]), "rewrite", rewrite)


@pytest.mark.parametrize("verify", ["--verify", "--no-verify"])
def test_a_pass_that_breaks_loading_is_dropped(verify, conv_bn_writes_an_unknown_operator, tmp_path):
    onnx.save(conv_bn_model(), tmp_path / "m.onnx")
    result = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "out.onnx", verify)
    assert "conv-bn" in result.stderr + result.stdout
    written = onnx.load(tmp_path / "out.onnx")
    assert "NoSuchOperator" not in {n.op_type for n in written.graph.node}
    assert {n.op_type for n in written.graph.node} >= {"BatchNormalization"}


@pytest.fixture
def bodies_lose_outer_weights(monkeypatch):
    """The bug this guards against: a weight read only inside a branch left out of the output."""
    monkeypatch.setattr(graph.io, "_hoist_outer_initializers", lambda g, outer: [
        body.ClearField("initializer") for body in graph.io.all_graphs(g) if body is not g])


@pytest.mark.parametrize("verify", ["--verify", "--no-verify"])
def test_no_pass_to_blame_is_an_internal_error(verify, bodies_lose_outer_weights, tmp_path):
    onnx.save(outer_weight_in_both_branches(), tmp_path / "m.onnx")
    result = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "out.onnx", verify)
    assert result.exit_code == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "even with every pass left out" in lines[0] and "nothing written" in lines[0], lines
    assert not (tmp_path / "out.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_model_that_loads_costs_no_bisection(tmp_path, monkeypatch):
    """The check builds nothing more when the output loads."""
    builds = []
    real = fusing.fuse
    monkeypatch.setattr("fuse_cli.api.fuse", lambda *a, **k: builds.append(1) or real(*a, **k))
    onnx.save(conv_bn_model(), tmp_path / "m.onnx")
    result = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "out.onnx", "--no-verify")
    assert result.exit_code == 0, result.stderr
    assert len(builds) == 1
