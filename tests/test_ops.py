"""The operator catalogue (fuse_cli/ops/): each record speaks for its own operator, every operator
a pass emits has one, and the shape and memory rules are looked up from the records."""

import pytest
from onnx import defs

from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.ops import BY_KEY, OPERATORS, held_workspace_bytes, stand_ins, workspace_bytes
from fuse_cli.passes import REGISTRY
from tests.graphs import GraphBuilder


@pytest.mark.parametrize("record", OPERATORS, ids=lambda r: f"{r.domain}::{r.op}" if r.domain else r.op)
def test_every_row_of_a_record_names_its_own_operator(record):
    keyed = [(row.op, row.domain) for row in (record.support, record.probe) if row is not None]
    keyed += [(c.op, c.domain) for c in (*record.contracts, *record.unchecked)]
    assert all(key == (record.op, record.domain) for key in keyed), keyed
    # a measurement names the operator or one form of it, "op:attribute"
    assert all(s.op.partition(":")[0] == record.op for s in record.slower)
    assert not record.standard or record.support is not None


def test_each_operator_has_one_record():
    assert len(BY_KEY) == len(OPERATORS)


def test_every_operator_a_pass_emits_has_its_support_and_a_shape_rule():
    for p in REGISTRY.values():
        for qualified in getattr(p, "emits", ()):
            domain, _, op = qualified.rpartition("::")
            domain = "" if domain in ("", "ai.onnx") else domain
            if domain == "" and defs.has(op, ""):
                continue  # standard: onnx infers it, targets allow it where onnxruntime runs it
            record = BY_KEY.get((domain, op))
            assert record is not None and record.support is not None, (p.name, qualified)
            # onnx has no inference for it: without a stand-in every shape after it is lost
            assert record.stand_in is not None, (p.name, qualified)


def test_a_fused_node_is_inferred_through_its_records_stand_in():
    b = GraphBuilder(opset=17, extra_opsets={"com.microsoft": 1})
    x = b.input("x", ["batch", 3, 8, 8])
    y = b.op("FusedConv", x, b.const(b.rand(4, 3, 3, 3)), domain="com.microsoft", activation="Relu",
             pads=[1, 1, 1, 1], strides=[2, 2])
    model = b.build(b.op("Relu", y), output_names=["out"])
    node = model.graph.node[0]
    (conv,) = stand_ins(node, 17)
    assert conv.op_type == "Conv" and {a.name for a in conv.attribute} == {"pads", "strides"}
    assert infer_shapes(model, dims={"batch": 2}).get("out").shape == (2, 4, 4, 4)
    assert stand_ins(model.graph.node[1], 17) == []  # Relu: onnx infers it


def test_workspace_rules_come_from_the_records():
    b = GraphBuilder(opset=17, extra_opsets={"com.microsoft": 1})
    a, c, d, e = (b.input(name, [4, 256]) for name in "acde")
    four = b.op("Sum", a, c, d, e)
    two = b.op("Sum", a, c)
    gelu = b.op("BiasGelu", a, b.const(b.rand(256)), domain="com.microsoft")
    relu = b.op("Relu", a)
    model = b.build(four, two, gelu, relu)
    shapes = infer_shapes(model)
    by_output = {node.output[0]: node for node in model.graph.node}
    size = 4 * 256 * 4
    # Sum over four: two partials alive at once, the first in the fresh output's place; where the
    # output is a buffer held before, both in full
    assert workspace_bytes(by_output[four], shapes, 17) == size
    assert held_workspace_bytes(by_output[four], shapes, 17) == 2 * size
    assert workspace_bytes(by_output[two], shapes, 17) == 0 == held_workspace_bytes(by_output[two], shapes, 17)
    assert workspace_bytes(by_output[gelu], shapes, 17) == size  # input + bias into a temporary
    assert (workspace_bytes(by_output[relu], shapes, 17) == 0
            and held_workspace_bytes(by_output[relu], shapes, 17) is None)
