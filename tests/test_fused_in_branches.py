"""Every pass runs inside If branches as it does in the main graph: each sample model, put whole in
both branches of an If that read its weights from the main graph (as optimum's merged decoders
read theirs), fuses in each branch what it fuses on its own, and matches the original on both
branches at two settings."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fuse_cli import api
from fuse_cli.config import FuseConfig
from fuse_cli.core.feeds import random_inputs
from fuse_cli.verify import make_session, verify_models
from tests.conftest import SAMPLES

UPGRADE = {"transformer_block_opset14.onnx": 17, "transformer_block_opset17.onnx": 20}
SETTINGS = ({"batch": 2, "sequence": 5}, {"batch": 3, "sequence": 7})


def _branch(graph: onnx.GraphProto, prefix: str) -> onnx.GraphProto:
    """`graph`'s nodes with every name they make prefixed (names are unique across a model),
    reading the main graph's inputs and weights; its outputs under the prefix."""
    made = {out for node in graph.node for out in node.output if out}
    rename = {name: prefix + name for name in made}
    nodes = []
    for node in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        copy.input[:] = [rename.get(i, i) for i in node.input]
        copy.output[:] = [rename.get(o, o) for o in node.output]
        nodes.append(copy)
    outputs = [helper.make_tensor_value_info(rename[o.name], o.type.tensor_type.elem_type, None) for o in graph.output]
    return helper.make_graph(nodes, prefix, [], outputs)


def in_both_branches(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    node = helper.make_node("If", ["take_then"], [o.name for o in graph.output], name="choose",
                            then_branch=_branch(graph, "then/"), else_branch=_branch(graph, "else/"))
    wrapped = helper.make_graph([node], graph.name,
                                [*graph.input, helper.make_tensor_value_info("take_then", TensorProto.BOOL, [])],
                                list(graph.output), list(graph.initializer))
    result = helper.make_model(wrapped, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    result.functions.extend(model.functions)
    return result


def _fired(result: api.OptimizeResult, prefix: str = "") -> Counter:
    return Counter(f.pass_name for f in result.report.fusions if f.replaced and f.replaced[0].startswith(prefix))


@pytest.mark.parametrize("target", ["onnx", "ort-cpu"])
@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.onnx")))
def test_a_model_fuses_alike_inside_branches(sample, target, tmp_path):
    config = FuseConfig(target=target, verify=False, allow_peak_growth=True, upgrade_opset=UPGRADE.get(sample))
    alone = api.optimize(SAMPLES / sample, config, tmp_path / "alone.onnx")
    original = onnx.load(SAMPLES / sample)
    if UPGRADE.get(sample):
        original = onnx.version_converter.convert_version(original, UPGRADE[sample])
        original.ir_version = min(original.ir_version, 10)
    wrapped = in_both_branches(original)
    onnx.save(wrapped, tmp_path / "wrapped.onnx")
    result = api.optimize(tmp_path / "wrapped.onnx", FuseConfig(target=target, verify=False, allow_peak_growth=True),
                          tmp_path / "out.onnx")
    wanted = _fired(alone) - Counter({"unhold-buffers": 99, "schedule": 99})  # model passes: main graph only
    assert _fired(result, "then/") == wanted
    assert _fired(result, "else/") == wanted
    session = make_session(original)
    for dims in SETTINGS:
        feeds = random_inputs(session, dims=dims, seed=sum(dims.values()))
        for take_then in (True, False):
            check = verify_models(wrapped, result.model, feeds={**feeds, "take_then": np.array(take_then)})
            assert check.passed, (take_then, dims, check.failing())
