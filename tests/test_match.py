"""The matcher on its own: bindings, commuted inputs, alternatives, constants, optional inputs,
attribute predicates and domains, on graphs of a few graphsurgeon nodes."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from fuse_cli.match import Alt, Const, Op, Var, constant_value, match_root, root_op_types, scalar_close


def _var(name: str) -> gs.Variable:
    return gs.Variable(name, dtype=np.float32, shape=[2, 3])


def _node(op: str, inputs, name: str, domain: str = "", **attrs) -> gs.Node:
    out = _var(f"{name}_out")
    return gs.Node(op=op, name=name, domain=domain, attrs=attrs, inputs=list(inputs), outputs=[out])


def _matches(pattern, node) -> list:
    return list(match_root(pattern, node))


def test_var_binds_a_tensor_and_a_repeated_name_must_be_the_same_tensor():
    x, y = _var("x"), _var("y")
    square = _node("Sub", [x, x], "square")
    other = _node("Sub", [x, y], "other")
    pattern = Op("Sub", Var("a"), Var("a"), name="sub")
    (m,) = _matches(pattern, square)
    assert m.tensor("a") is x and m.node("sub") is square and m.covered == [square]
    assert _matches(pattern, other) == []


def test_commutative_inputs_are_tried_in_both_orders():
    x = _var("x")
    half = gs.Constant("half", np.array(0.5, np.float32))
    mul = _node("Mul", [half, x], "mul")
    sub = _node("Sub", [half, x], "sub")
    pattern = Op(("Mul", "Sub"), Var("x"), Const(scalar_close(0.5), name="c"))
    (m,) = _matches(pattern, mul)
    assert m.tensor("x") is x and m.tensor("c") is half
    assert _matches(pattern, sub) == []  # Sub does not commute


def test_nested_op_covers_the_producer_and_a_named_op_names_its_output():
    x = _var("x")
    relu = _node("Relu", [x], "relu")
    neg = _node("Neg", [relu.outputs[0]], "neg")
    (m,) = _matches(Op("Neg", Op("Relu", Var("x"), name="r"), name="n"), neg)
    assert [n.name for n in m.covered] == ["neg", "relu"]
    assert m.tensor("r") is relu.outputs[0] and m.tensor("n") is neg.outputs[0]


def test_alt_yields_every_option_that_fits_in_order():
    x = _var("x")
    relu = _node("Relu", [x], "relu")
    neg = _node("Neg", [relu.outputs[0]], "neg")
    pattern = Op("Neg", Alt(Op("Relu", Var("x"), name="relu"), Var("x")))
    found = _matches(pattern, neg)
    assert [m.tensor("x").name for m in found] == ["x", "relu_out"]
    assert "relu" in found[0].nodes and "relu" not in found[1].nodes


def test_root_alt_and_root_op_types():
    pattern = Alt(Op("Relu", Var("x")), Op(("Neg", "Abs"), Var("x")))
    assert root_op_types(pattern) == {"Relu", "Neg", "Abs"}
    with pytest.raises(TypeError):
        root_op_types(Var("x"))


def test_optional_trailing_inputs_bind_none():
    x = _var("x")
    clip = _node("Clip", [x], "clip")
    (m,) = _matches(Op("Clip", Var("x"), Var("low", optional=True), Var("high", optional=True)), clip)
    assert m.tensor("low") is None and m.tensor("high") is None
    assert _matches(Op("Clip", Var("x"), Var("low")), clip) == []  # a required input is missing


def test_const_var_is_recorded_for_the_engine_check():
    x, w = _var("x"), gs.Constant("w", np.ones((3, 3), np.float32))
    matmul = _node("MatMul", [x, w], "matmul")
    (m,) = _matches(Op("MatMul", Var("x"), Var("w", const=True)), matmul)
    assert m.const_vars == [("w", matmul)]
    assert constant_value(m.tensor("w")) is not None


@pytest.mark.parametrize("perm, fits",
                         [([0, 2, 1, 3], True), ((0, 2, 1, 3), True), ([0, 2, 3, 1], False), (None, False)])
def test_attribute_value(perm, fits):
    attrs = {} if perm is None else {"perm": perm}
    transpose = _node("Transpose", [_var("x")], "t", **attrs)
    assert bool(_matches(Op("Transpose", Var("x"), perm=[0, 2, 1, 3]), transpose)) is fits


def test_attribute_predicate_sees_none_when_the_attribute_is_absent():
    seen = []

    def unset(value) -> bool:
        seen.append(value)
        return not value

    plain = _node("Gemm", [_var("a"), _var("b")], "plain")
    transposed = _node("Gemm", [_var("a"), _var("b")], "transposed", transA=1)
    pattern = Op("Gemm", Var("a"), Var("b"), transA=unset)
    assert len(_matches(pattern, plain)) == 1 and _matches(pattern, transposed) == []
    # (the matcher's cheap pre-check asks the predicate too, so each value may be seen twice)
    assert set(seen) == {None, 1}


def test_string_attributes_compare_with_bytes():
    gelu = _node("Gelu", [_var("x")], "gelu", approximate=b"tanh")
    assert _matches(Op("Gelu", Var("x"), approximate="tanh"), gelu)
    assert not _matches(Op("Gelu", Var("x"), approximate="none"), gelu)


def test_domain_must_match_and_ai_onnx_is_the_default_domain():
    x = _var("x")
    ms = _node("Gelu", [x], "ms", domain="com.microsoft")
    std = _node("Gelu", [x], "std", domain="ai.onnx")
    assert _matches(Op("Gelu", Var("x"), domain="com.microsoft"), ms)
    assert not _matches(Op("Gelu", Var("x")), ms)
    assert _matches(Op("Gelu", Var("x")), std)


def test_a_node_is_covered_once():
    x = _var("x")
    relu = _node("Relu", [x], "relu")
    add = _node("Sub", [relu.outputs[0], relu.outputs[0]], "add")
    (m,) = _matches(Op("Sub", Op("Relu", Var("x"), name="r"), Var("r")), add)
    assert [n.name for n in m.covered] == ["add", "relu"]
