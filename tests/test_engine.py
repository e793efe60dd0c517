"""The engine on its own, with toy passes: the fixpoint, the books it keeps (records, removed
tensors and their sizes, near-misses from the last quiet round), the shared safety check, and the
target and opset gates it applies before a pass's own check."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, Op, Var
from fuse_cli.pipeline import engine
from fuse_cli.pipeline.base import Decline, PatternPass
from fuse_cli.pipeline.records import FusionRecord, NearMiss, RemovedTensor


class CollapseRelus(PatternPass):
    """Relu(Relu(x)) = Relu(x)."""

    name = "collapse-relus"
    description = "toy"
    label = "Relu + Relu -> Relu"
    pattern = Op("Relu", Op("Relu", Var("x"), name="inner"), name="outer")

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        return Replacement(nodes=[gs.Node(op="Relu", name=g.unique_name("relu"), inputs=[m.tensor("x")],
                                          outputs=[m.root.outputs[0]])])


class DeclineAll(CollapseRelus):
    name = "decline-all"

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return Decline(f"{m.node('outer').name} declined")


class EmitFusedGemm(CollapseRelus):
    name = "emit-fused-gemm"
    emits = ("com.microsoft::FusedGemm",)

    def emitted_at(self, m: Match, g: GraphEditor):
        return g.dtype(m.tensor("x")), m.node("inner")


class NeedsOpset99(CollapseRelus):
    name = "needs-opset-99"
    min_opset = 99


def _relu_chain(length: int, *, read_middle: bool = False) -> gs.Graph:
    x = gs.Variable("x", dtype=np.float32, shape=[2, 4])
    t, nodes = x, []
    for i in range(length):
        out = gs.Variable(f"t{i}", dtype=np.float32, shape=[2, 4])
        nodes.append(gs.Node(op="Relu", name=f"relu{i}", inputs=[t], outputs=[out]))
        t = out
    outputs = [t] + ([nodes[0].outputs[0]] if read_middle else [])
    return gs.Graph(nodes=nodes, inputs=[x], outputs=outputs, opset=17)


def _run(graph: gs.Graph, passes, target: str = "onnx", opset: int = 17):
    g = GraphEditor(graph, opset=opset, shapes={}, dtypes={}, target=target)
    return engine.run_pipeline(g, passes, size_of=lambda name: 32)


def test_a_fusion_is_recorded_with_the_removed_intermediate_and_its_size():
    graph = _relu_chain(2)
    fusions, misses = _run(graph, [CollapseRelus()])
    assert fusions == [FusionRecord("collapse-relus", "Relu + Relu -> Relu", ("relu0", "relu1"), ("relu",),
                                    (RemovedTensor("t0", 32),))]
    assert misses == [] and [n.op for n in graph.nodes] == ["Relu"]


def test_runs_to_a_fixpoint():
    graph = _relu_chain(5)
    fusions, _ = _run(graph, [CollapseRelus()])
    assert len(graph.nodes) == 1 and len(fusions) == 4
    assert graph.nodes[0].inputs[0].name == "x" and graph.nodes[0].outputs[0].name == "t4"


def test_an_intermediate_read_elsewhere_is_a_near_miss():
    graph = _relu_chain(2, read_middle=True)
    fusions, misses = _run(graph, [CollapseRelus()])
    assert fusions == []
    assert misses == [NearMiss("collapse-relus", "Relu + Relu -> Relu", ("relu0", "relu1"),
                               "relu0's output 't0' is a graph output")]


def test_check_declines_and_the_graph_is_unchanged():
    graph = _relu_chain(3)
    fusions, misses = _run(graph, [DeclineAll()])
    assert fusions == [] and len(graph.nodes) == 3
    assert [m.reason for m in misses] == ["relu2 declined", "relu1 declined"]


def test_near_misses_describe_the_final_graph():
    """A miss in an early round that a later rewrite resolved is not reported."""
    graph = _relu_chain(3)
    fusions, misses = _run(graph, [CollapseRelus(), DeclineAll()])
    assert len(fusions) == 2 and misses == []


def test_the_engine_asks_the_target_table_before_the_check():
    _, misses = _run(_relu_chain(2), [EmitFusedGemm()], target="ort-cuda")
    (miss,) = misses
    assert miss.reason.startswith("relu0: FusedGemm has no kernel on onnxruntime's CUDA provider")
    fusions, misses = _run(_relu_chain(2), [EmitFusedGemm()], target="ort-cpu")
    assert len(fusions) == 1 and misses == []


def test_the_opset_gate():
    _, (miss,) = _run(_relu_chain(2), [NeedsOpset99()])
    assert miss.reason == ("the fused operator needs opset 99, the model has opset 17: "
                           "pass --upgrade-opset 99 to convert the model first")


def test_the_engine_does_not_import_the_report():
    tree = ast.parse(inspect.getsource(engine))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name and name.startswith("fuse_cli.report") for name in imported)
