"""A tiny graph builder so a test graph takes a few lines.

    b = GraphBuilder(opset=17)
    x = b.input("x", [1, 3, 8, 8])
    y = b.op("Conv", x, b.const(w), b.const(bias), pads=[1, 1, 1, 1])
    model = b.build(b.op("Relu", y), output_name="y")
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8  # onnx 1.23 helpers default to IR 14, which onnxruntime 1.31 rejects


class GraphBuilder:
    def __init__(self, opset: int = 17, seed: int = 0, extra_opsets: dict[str, int] | None = None):
        self.opset = opset
        self.extra_opsets = extra_opsets or {}
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = Counter()

    def _name(self, base: str) -> str:
        self._count[base] += 1
        return f"{base}_{self._count[base]}"

    def input(self, name: str, shape: Sequence[int | str | None], dtype=TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, value, name: str | None = None, dtype=np.float32) -> str:
        array = np.asarray(value, dtype=dtype if not isinstance(value, np.ndarray) else value.dtype)
        name = name or self._name("c")
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def rand(self, *shape: int, low: float = -1.0, high: float = 1.0, dtype=np.float32) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(dtype)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", name: str | None = None,
           **attrs) -> str | list[str]:
        name = name or self._name(op_type)
        outs = [f"{name}_out{i}" if outputs > 1 else f"{name}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, domain=domain, **attrs))
        return outs if outputs > 1 else outs[0]

    def build(self, *outputs: str, output_names: Sequence[str] | None = None, ir_version: int = IR_VERSION,
              initializers_as_inputs: bool = False) -> onnx.ModelProto:
        """Outputs are renamed by Identity-free renaming of the producing node's output."""
        final = list(outputs)
        if output_names:
            rename = dict(zip(outputs, output_names))
            for node in self.nodes:
                node.output[:] = [rename.get(o, o) for o in node.output]
                node.input[:] = [rename.get(i, i) for i in node.input]
            final = list(output_names)
        graph_inputs = list(self.inputs)
        if initializers_as_inputs:
            graph_inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in self.initializers]
        graph = helper.make_graph(self.nodes, "test", graph_inputs,
                                  [helper.make_tensor_value_info(o, 0, None) for o in final], self.initializers)
        opsets = [helper.make_opsetid("", self.opset),
                  *(helper.make_opsetid(d, v) for d, v in self.extra_opsets.items())]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
        model = onnx.shape_inference.infer_shapes(model)
        # keep only input/output types from inference; intermediate value_info is not what exporters write
        del model.graph.value_info[:]
        return model


def op_counts(model: onnx.ModelProto) -> Counter:
    """Node counts keyed by op type ("Conv") or by "domain::Op" for non-default domains."""
    return Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in model.graph.node)


def signature(model: onnx.ModelProto) -> list[tuple[str, list[str], list[str]]]:
    """Each node's op, inputs and outputs, in order: equal signatures mean an unchanged graph."""
    return [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]


def assert_declined(model: onnx.ModelProto, result, pass_name: str, reason: str) -> None:
    """Nothing changed, and the pass's one near-miss says `reason`."""
    assert not result.report.fusions
    assert signature(result.model) == signature(model)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == pass_name]
    assert reason in miss
