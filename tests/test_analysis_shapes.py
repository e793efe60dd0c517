"""Shape inference with bound symbolic dims: sizes are exact or explicitly unknown."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.shapes import (
    TensorInfo,
    UnknownDim,
    at_dims,
    element_size_bits,
    infer_shapes,
)
from tests.graphs import GraphBuilder

FLOAT = TensorProto.FLOAT


def value(name, shape=None, elem_type=FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), extra_opsets=(), opset=17):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    return helper.make_model(graph, ir_version=8, opset_imports=opsets)


def relu_chain(input_shape):
    """x -> Relu -> a -> Relu -> y"""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return model(nodes, [value("x", input_shape)], [value("y")])


@pytest.mark.parametrize(
    ("elem_type", "bits"),
    [
        (TensorProto.FLOAT, 32),
        (TensorProto.FLOAT16, 16),
        (TensorProto.BFLOAT16, 16),
        (TensorProto.INT8, 8),
        (TensorProto.UINT8, 8),
        (TensorProto.BOOL, 8),
        (TensorProto.INT64, 64),
        (TensorProto.DOUBLE, 64),
        (TensorProto.FLOAT8E4M3FN, 8),
        (TensorProto.FLOAT8E4M3FNUZ, 8),
        (TensorProto.FLOAT8E5M2, 8),
        (TensorProto.FLOAT8E5M2FNUZ, 8),
        (TensorProto.INT4, 4),
        (TensorProto.UINT4, 4),
        (TensorProto.FLOAT4E2M1, 4),
        (TensorProto.STRING, None),
        (TensorProto.UNDEFINED, None),
    ],
)
def test_element_size_bits(elem_type, bits):
    assert element_size_bits(elem_type) == bits


def test_nbytes_rounds_packed_sub_byte_tensors_up_once():
    # 3 int4 = 12 bits -> 2 bytes; 4 int4 = 2 bytes exactly.
    assert TensorInfo("t", TensorProto.INT4, (3,)).nbytes() == 2
    assert TensorInfo("t", TensorProto.INT4, (2, 2)).nbytes() == 2
    assert TensorInfo("t", TensorProto.FLOAT16, (2, 3)).nbytes() == 12
    assert TensorInfo("t", TensorProto.FLOAT, ()).nbytes() == 4
    assert TensorInfo("t", TensorProto.FLOAT, (0, 5)).nbytes() == 0


@pytest.mark.parametrize(
    "info",
    [
        TensorInfo("t", FLOAT, None),
        TensorInfo("t", FLOAT, ("batch", 4)),
        TensorInfo("t", FLOAT, (None, 4)),
        TensorInfo("t", 0, (2, 4)),
        TensorInfo("t", TensorProto.STRING, (2,)),
    ],
)
def test_nbytes_is_none_unless_everything_is_known(info):
    assert info.nbytes() is None


def test_static_shapes_are_inferred_for_every_tensor():
    table = infer_shapes(relu_chain([2, 8]))
    assert table.get("x") == TensorInfo("x", FLOAT, (2, 8))
    assert table.get("a") == TensorInfo("a", FLOAT, (2, 8))
    assert table.nbytes("y") == 2 * 8 * 4
    assert table.unknown_dims == ()
    assert table.get("nope") is None and table.nbytes("nope") is None


def test_symbolic_dim_is_unknown_until_bound():
    m = relu_chain(["batch", 8])

    unbound = infer_shapes(m)
    assert unbound.nbytes("a") is None
    assert UnknownDim("x", 0, "batch") in unbound.unknown_dims
    assert UnknownDim("a", 0, "batch") in unbound.unknown_dims
    assert {u.tensor for u in unbound.unknown_dims} == {"x", "a", "y"}

    bound = infer_shapes(m, dims={"batch": 4})
    assert bound.get("a").shape == (4, 8)
    assert bound.nbytes("y") == 4 * 8 * 4
    assert bound.unknown_dims == ()
    assert dict(bound.bound_dims) == {"batch": 4}


def test_anonymous_dims_are_unknown_without_onnx_placeholder_names():
    # onnx names anonymous dims "unk__0" downstream; no user can bind that, so it is reported
    # as an anonymous (None) dim.
    table = infer_shapes(relu_chain([None, 8]))
    assert table.get("a").shape == (None, 8)
    assert UnknownDim("a", 0, None) in table.unknown_dims


def test_binding_does_not_modify_the_callers_model():
    m = relu_chain(["batch", 8])
    before = m.SerializeToString()
    infer_shapes(m, dims={"batch": 4}, input_shapes={"x": [4, 8]})
    assert m.SerializeToString() == before


def test_input_shapes_bind_the_input_and_the_symbols_it_declares():
    # Giving x's shape binds "batch", which also sizes the other input that uses it.
    nodes = [helper.make_node("Add", ["x", "mask"], ["y"])]
    m = model(nodes, [value("x", ["batch", "seq"]), value("mask", ["batch", 1])], [value("y")])
    table = infer_shapes(m, input_shapes={"x": [2, 5]})
    assert table.get("mask").shape == (2, 1)
    assert table.get("y").shape == (2, 5)
    assert table.nbytes("y") == 2 * 5 * 4
    assert dict(table.bound_dims) == {"batch": 2, "seq": 5}


def test_input_shapes_give_a_rank_to_an_input_declared_without_one():
    table = infer_shapes(relu_chain(None), input_shapes={"x": [3, 7]})
    assert table.nbytes("y") == 3 * 7 * 4


def test_input_shapes_rank_mismatch_is_a_clear_value_error():
    with pytest.raises(ValueError, match=r"input 'x' has rank 2 .* gives rank 3"):
        infer_shapes(relu_chain(["batch", 8]), input_shapes={"x": [1, 2, 8]})


def test_input_shapes_unknown_input_name_is_a_value_error():
    with pytest.raises(ValueError, match=r"'y_typo', which is not a graph input \(inputs: x\)"):
        infer_shapes(relu_chain(["batch", 8]), input_shapes={"y_typo": [1, 8]})


def test_input_shapes_may_not_contradict_a_fixed_dim_or_dims():
    m = relu_chain(["batch", 8])
    with pytest.raises(ValueError, match="dim 1 is fixed at 8"):
        infer_shapes(m, input_shapes={"x": [1, 9]})
    with pytest.raises(ValueError, match="bound to 4 elsewhere"):
        infer_shapes(m, dims={"batch": 4}, input_shapes={"x": [2, 8]})


@pytest.mark.parametrize("bad", [-1, 2.5, "4", True])
def test_dim_values_must_be_non_negative_integers(bad):
    with pytest.raises(ValueError, match="non-negative integer"):
        infer_shapes(relu_chain(["batch", 8]), dims={"batch": bad})


def test_dims_naming_no_symbol_of_the_model_are_reported_not_fatal():
    table = infer_shapes(relu_chain(["batch", 8]), dims={"batch": 1, "btach": 1})
    assert table.unused_dims == ("btach",)
    assert table.nbytes("y") == 32


def test_data_propagation_resolves_computed_reshape_targets():
    # y = Reshape(x, Concat(Shape(x)[:1], [-1])). Without data propagation onnx knows only the
    # rank. With it, dim 0 is "batch"; the -1 resolves to 32 only once batch is bound BEFORE
    # inference (batch*4*8 / batch is beyond onnx's symbolic arithmetic).
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["lead"]),
        helper.make_node("Concat", ["lead", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    consts = [
        numpy_helper.from_array(np.array([v], np.int64), n)
        for n, v in [("zero", 0), ("one", 1), ("minus_one", -1)]
    ]
    m = model(nodes, [value("x", ["batch", 4, 8])], [value("y")], consts)
    assert infer_shapes(m).get("y").shape == ("batch", None)
    assert infer_shapes(m, dims={"batch": 3}).get("y").shape == (3, 32)


def test_initializers_are_sized_from_their_dims():
    w = numpy_helper.from_array(np.ones((8, 16), np.float16), "w")
    f16 = TensorProto.FLOAT16
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, [value("x", [2, 8], f16)], [value("y", None, f16)], [w])
    table = infer_shapes(m)
    assert table.nbytes("w") == 8 * 16 * 2
    assert table.get("y") == TensorInfo("y", TensorProto.FLOAT16, (2, 16))


def test_big_initializer_payloads_are_not_needed_and_not_touched():
    # 64x64 float32 = 16 KiB, above the payload cut-off: inference runs without the values and
    # the caller's tensor keeps them.
    w = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, [value("x", ["batch", 64])], [value("y")], [w])
    table = infer_shapes(m, dims={"batch": 2})
    assert table.nbytes("y") == 2 * 64 * 4
    assert table.warnings == ()
    assert numpy_helper.to_array(m.graph.initializer[0])[63, 63] == 64 * 64 - 1


def test_custom_domain_node_in_the_middle_does_not_crash():
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("FusedThing", ["a"], ["b"], domain="com.microsoft"),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    ms = helper.make_opsetid("com.microsoft", 1)
    table = infer_shapes(model(nodes, [value("x", [2, 8])], [value("y")], extra_opsets=[ms]))
    assert table.nbytes("a") == 64
    assert table.nbytes("b") is None and table.nbytes("y") is None
    assert UnknownDim("b", None, None) in table.unknown_dims


def test_custom_domain_without_opset_import_still_infers_the_rest():
    # onnx aborts inference of the whole model for a domain with no opset import.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Mystery", ["a"], ["b"], domain="vendor.ops"),
    ]
    table = infer_shapes(model(nodes, [value("x", [2, 8])], [value("b")]))
    assert table.nbytes("a") == 64
    assert table.get("b").shape is None


def test_opset_newer_than_onnx_knows_degrades_without_raising():
    m = relu_chain([2, 8])
    m.opset_import[0].version = 99
    table = infer_shapes(m)
    assert set(table.tensors) == {"x", "a", "y"}
    assert table.nbytes("x") == 64


def test_subgraph_internal_tensors_are_left_out():
    branch = lambda op, out: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["x"], [out])], op, [], [value(out)]
    )
    nodes = [
        helper.make_node(
            "If", ["cond"], ["y"], then_branch=branch("Relu", "t"), else_branch=branch("Neg", "e")
        )
    ]
    m = model(nodes, [value("x", [2, 8]), value("cond", [], TensorProto.BOOL)], [value("y")])
    table = infer_shapes(m)
    assert set(table.tensors) == {"x", "cond", "y"}
    assert table.nbytes("y") == 64
    assert table.nbytes("cond") == 1


def test_a_model_inference_rejects_entirely_keeps_declared_types():
    # No default-domain opset import: onnx refuses the model outright.
    m = relu_chain([2, 8])
    del m.opset_import[:]
    table = infer_shapes(m)
    assert table.nbytes("x") == 64
    assert table.get("a") == TensorInfo("a", 0, None)
    assert len(table.warnings) == 2
    assert "onnx shape inference failed" in table.warnings[0]


def test_unsorted_graph_is_inferred_in_dependency_order():
    # onnx infers in stored order; stored y = Relu(a) before a = Relu(x) would leave y unknown.
    nodes = [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Relu", ["x"], ["a"])]
    table = infer_shapes(model(nodes, [value("x", [2, 8])], [value("y")]))
    assert table.nbytes("y") == 64


def _embeddings_model():
    """BERT's embeddings as exporters write them: position embeddings sliced to Min(512, sequence)."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((512, 4), np.float32), "positions")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("one", [1]), ("two", [2]), ("zero", [0]), ("limit", [512]))]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["seq"]),
        helper.make_node("Min", ["seq", "limit"], ["length"]),
        helper.make_node("Slice", ["positions", "zero", "length"], ["pos"]),
        helper.make_node("Add", ["x", "pos"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "emb",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [table, *consts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_symbolic_inference_recovers_dims_onnx_loses():
    model = _embeddings_model()
    plain = infer_shapes(model)
    assert plain.get("y").shape is None or None in plain.get("y").shape  # onnx cannot see through Min(512, ...)
    assert infer_shapes(model, symbolic=True).get("y").shape == ("batch", "sequence", 4)


def test_symbolic_inference_never_overrides_what_onnx_knows():
    """onnxruntime's inference would merge batch with 2 across [batch, 3] * [2, 3]; batch may be 1."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "c"], ["y"]), helper.make_node("Relu", ["x"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((2, 3), np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    table = infer_shapes(model, symbolic=True)
    assert table.get("x").shape == ("batch", 3) and table.get("r").shape == ("batch", 3)


def test_symbolic_inference_names_nothing_the_model_does_not():
    """onnxruntime's symbolic inference names a dim it cannot compute after the node
    (NonZero_..._o0__d1, Pad_49_o0__d1 in timm's swin). Those are no symbols of the model and
    nothing a user can bind: they stay unknown, never a bindable symbol (the audit took such a
    symbol as 1)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("NonZero", ["x"], ["n"]), helper.make_node("Transpose", ["n"], ["t"]),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for table in (infer_shapes(model, symbolic=True), infer_shapes(model, {"batch": 2}, symbolic=True)):
        assert table.get("y").shape == (None, 2)
        assert all(u.symbol in (None, "batch") for u in table.unknown_dims)


def test_a_model_edited_in_place_is_inferred_again():
    """infer_shapes reuses its light copy of a model it has just inferred; an edit in place is seen."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert infer_shapes(model, {"batch": 2}).get("y").shape == (2, 3)
    assert infer_shapes(model).get("y").shape == ("batch", 3)
    model.graph.node[0].CopyFrom(helper.make_node("Transpose", ["x"], ["y"]))
    assert infer_shapes(model, {"batch": 2}).get("y").shape == (3, 2)


def test_group_query_attention_presents_are_sized():
    """Without a past, present_key/present_value are K and V split into heads: sized, so the
    memory model counts them (left unknown they were not)."""
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens", "total"], ["y", "pk", "pv"],
                            domain="com.microsoft", num_heads=4, kv_num_heads=2)
    inputs = [value("q", ["batch", "sequence", 128]), value("k", ["batch", "sequence", 64]),
              value("v", ["batch", "sequence", 64]), value("seqlens", ["batch"], TensorProto.INT32),
              value("total", [], TensorProto.INT32)]
    m = model([node], inputs, [value("y"), value("pk"), value("pv")],
              extra_opsets=[helper.make_opsetid("com.microsoft", 1)])
    table = infer_shapes(m, {"batch": 3, "sequence": 5})
    assert table.get("y").shape == (3, 5, 128)
    assert table.get("pk").shape == table.get("pv").shape == (3, 2, 5, 32)


# ------------------------------------------------------------ a table at dims, without inference

def _named_throughout() -> onnx.ModelProto:
    """Every dim a number or the input's symbols: Conv, a broadcast against a 1, a Concat, a MatMul."""
    b = GraphBuilder()
    x = b.input("x", ["batch", 3, 8, 8])
    c = b.op("Conv", x, b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1])
    scaled = b.op("Mul", c, b.const(b.rand(1, 4, 1, 1)))
    joined = b.op("Concat", scaled, c, axis=1)
    rows = b.input("rows", ["batch", "sequence", 8])
    return b.build(joined, b.op("MatMul", rows, b.const(b.rand(8, 2))), output_names=["y", "z"])


def test_a_table_named_throughout_is_its_inference_at_the_dims():
    model = _named_throughout()
    table = infer_shapes(model)
    for dims in ({"batch": 1, "sequence": 1}, {"batch": 3, "sequence": 5}):
        assert at_dims(table, dims).tensors == infer_shapes(model, dims).tensors


def test_no_table_at_dims_where_inference_left_a_dim_or_a_symbol_open():
    """A Reshape to [0, -1] leaves its second dim unknown without bindings (inference at the dims
    computes it); a symbol the dims do not bind (a declared intermediate's own name) stays open."""
    b = GraphBuilder()
    x = b.input("x", ["batch", "sequence", 8])
    flat = b.op("Reshape", x, b.const(np.array([0, -1], np.int64)))
    model = b.build(b.op("Relu", flat), output_names=["y"])
    dims = {"batch": 2, "sequence": 5}
    assert at_dims(infer_shapes(model), dims) is None
    assert infer_shapes(model, dims).get("y").shape == (2, 40)
    named = _named_throughout()
    assert at_dims(infer_shapes(named), {"batch": 2}) is None  # sequence unbound
