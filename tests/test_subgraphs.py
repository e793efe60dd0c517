"""Subgraphs are part of the model: passes run inside If branches and Loop/Scan bodies, within their scope."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.verify import make_session, run, verify_models
from tests.conftest import optimize_model
from tests.graphs import GraphBuilder, op_counts

RNG = np.random.default_rng(0)


def conv_bn_transposes(prefix: str, x: str, out: str, second_perm: list[int]) -> tuple[list, list]:
    """Nodes and initializers of x -> Conv -> BatchNormalization -> Transpose(NHWC) -> Transpose -> out."""
    weights = {
        "w": RNG.uniform(-1, 1, (4, 3, 3, 3)), "scale": RNG.uniform(0.5, 1.5, 4), "beta": RNG.uniform(-1, 1, 4),
        "mean": RNG.uniform(-1, 1, 4), "var": RNG.uniform(0.5, 2.0, 4),
    }
    inits = [numpy_helper.from_array(v.astype(np.float32), f"{prefix}_{k}") for k, v in weights.items()]
    nodes = [
        helper.make_node("Conv", [x, f"{prefix}_w"], [f"{prefix}_conv"], name=f"{prefix}_conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", [f"{prefix}_conv"] + [f"{prefix}_{k}" for k in
                         ("scale", "beta", "mean", "var")], [f"{prefix}_bn"], name=f"{prefix}_bn", epsilon=1e-3),
        helper.make_node("Transpose", [f"{prefix}_bn"], [f"{prefix}_nhwc"], name=f"{prefix}_t0", perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", [f"{prefix}_nhwc"], [out], name=f"{prefix}_t1", perm=second_perm),
    ]
    return nodes, inits


def branch(prefix: str, second_perm: list[int]) -> onnx.GraphProto:
    nodes, inits = conv_bn_transposes(prefix, "x", f"{prefix}_out", second_perm)
    return helper.make_graph(nodes, prefix, [], [helper.make_tensor_value_info(f"{prefix}_out", TensorProto.FLOAT,
                                                                               None)], inits)


def loop_body() -> onnx.GraphProto:
    """One Transpose pair per iteration on the carried value."""
    nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Transpose", ["v_in"], ["v_t"], name="loop_t0", perm=[1, 0]),
        helper.make_node("Transpose", ["v_t"], ["v_out"], name="loop_t1", perm=[1, 0]),
    ]
    inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
              helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2, 3])]
    outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
               helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2, 3])]
    return helper.make_graph(nodes, "body", inputs, outputs)


def model_with_subgraphs() -> onnx.ModelProto:
    b = GraphBuilder(opset=17)
    x, cond = b.input("x", [1, 3, 8, 8]), b.input("cond", [], dtype=TensorProto.BOOL)
    v = b.input("v", [2, 3])
    nodes, inits = conv_bn_transposes("top", x, "top_out", [0, 3, 1, 2])
    b.nodes += nodes
    b.initializers += inits
    b.nodes.append(helper.make_node("If", [cond], ["branch_out"], name="if",
                                    then_branch=branch("then", [0, 3, 1, 2]), else_branch=branch("else", [0, 2, 1, 3])))
    b.nodes.append(helper.make_node("Loop", [b.const(np.int64(2), dtype=np.int64), "", v], ["loop_out"], name="loop",
                                    body=loop_body()))
    return b.build("top_out", "branch_out", "loop_out")


def bodies(model: onnx.ModelProto, *, keep_value_info: bool = True) -> dict[str, bytes]:
    found = {}
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                body = onnx.GraphProto()
                body.CopyFrom(attr.g)
                if not keep_value_info:
                    del body.value_info[:]
                found[f"{node.name}.{attr.name}"] = body.SerializeToString()
    return found


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    model = model_with_subgraphs()
    return model, optimize_model(model, tmp_path_factory.mktemp("subgraphs"))


def branch_feeds(cond: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32), "cond": np.array(cond),
            "v": rng.standard_normal((2, 3)).astype(np.float32)}


def test_passes_run_inside_every_branch(fused):
    model, result = fused
    assert op_counts(result.model) == {"Conv": 1, "If": 1, "Loop": 1}
    fired = {(f.pass_name, f.replaced[0].split("_")[0]) for f in result.report.fusions}
    assert {("conv-bn", "top"), ("conv-bn", "then"), ("conv-bn", "else"), ("fuse-transposes", "then"),
            ("fuse-transposes", "else")} <= fired
    for cond in (True, False):
        check = verify_models(model, result.model, feeds=branch_feeds(cond), rtol=1e-4, atol=1e-5)
        assert check.passed, check.failing
    branches = {name: onnx.GraphProto.FromString(body) for name, body in bodies(result.model).items()}
    assert [n.op_type for n in branches["if.then_branch"].node] == ["Conv"]  # the transposes cancel
    assert [n.op_type for n in branches["if.else_branch"].node] == ["Conv", "Transpose"]


def test_a_body_keeps_its_interface(fused):
    """A Loop body's inputs and outputs keep their names, order and count: the Loop binds them by
    position. Its transpose pair is the identity on v, but v_out is a body output fed by a body
    input: that needs an Identity, so nothing fires there."""
    model, result = fused
    for name, body in bodies(result.model).items():
        before = onnx.GraphProto.FromString(bodies(model)[name])
        after = onnx.GraphProto.FromString(body)
        assert [i.name for i in after.input] == [i.name for i in before.input]
        assert [o.name for o in after.output] == [o.name for o in before.output]
    loop = onnx.GraphProto.FromString(bodies(result.model)["loop.body"])
    assert [n.op_type for n in loop.node] == ["Identity", "Transpose", "Transpose"]


def test_both_branches_are_exercised():
    """Guards the comparison above: the branches give differently shaped outputs, so running the
    model for both conditions does run both bodies."""
    session = make_session(model_with_subgraphs())
    feeds = {"x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32), "v": np.zeros((2, 3), np.float32)}
    shapes = {cond: run(session, {**feeds, "cond": np.array(cond)})["branch_out"].shape for cond in (True, False)}
    assert shapes == {True: (1, 4, 8, 8), False: (1, 8, 8, 4)}
