"""Activation liveness: every expected number here is worked out by hand in the comments.

Unless noted, activations are float32 [4, 8] = 128 bytes ("S"). The walk models onnxruntime (see
fuse_cli/analysis/memory.py): a graph input is the caller's and live for the whole run; a graph
output gets a buffer of its own; Relu-like activations run in place over an input they read last;
a dead buffer of the same shape is reused; steps follow onnxruntime's order.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.memory import (INPUT_PRODUCER, WORKSPACE, LiveTensor, flash_attention_buffer, planner_shapes,
                                      profile_memory, runtime_order)
from fuse_cli.core.order import execution_order
from fuse_cli.analysis.shapes import infer_shapes

FLOAT = TensorProto.FLOAT
S = 4 * 8 * 4


def value(name, shape=None, elem_type=FLOAT):
    return helper.make_tensor_value_info(name, elem_type, shape)


def model(nodes, inputs, outputs, initializers=(), extra_opsets=()):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", 17), *extra_opsets]
    return helper.make_model(graph, ir_version=8, opset_imports=opsets)


def node(op, inputs, outputs, **kwargs):
    """A node named after its first output, so expectations can name nodes."""
    return helper.make_node(op, inputs, outputs, name=f"{op}_{outputs[0]}", **kwargs)


def profile(m, **bindings):
    return profile_memory(m, infer_shapes(m, dims=bindings))


def relu_chain_nodes():
    return [node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]), node("Relu", ["b"], ["y"])]


def test_chain():
    # x -> a -> b -> y. x is the caller's, live throughout. b = Relu(a) runs in a's buffer (Relu
    # may run in place, Relu_b is a's last reader, same shape); y is a graph output: own buffer.
    #   step 0: x, a = 2S   step 1: x, a/b = 2S   step 2: x, b, y = 3S
    p = profile(model(relu_chain_nodes(), [value("x", [4, 8])], [value("y")]))
    assert p.timeline == (2 * S, 2 * S, 3 * S)
    assert (p.peak_bytes, p.peak_step, p.peak_node) == (3 * S, 2, "Relu_y")
    # b is the tenant of the buffer a was computed in
    assert p.live_at_peak == (
        LiveTensor("x", S, INPUT_PRODUCER), LiveTensor("b", S, "Relu_b"), LiveTensor("y", S, "Relu_y")
    )
    assert p.intermediate_bytes == 3 * S  # a, b, y written; x is not written by a node
    assert dict(p.by_op_type) == {"Relu": 3 * S}
    assert p.unknown_tensors == ()
    assert p.weight_bytes == 0


def test_diamond():
    # A = Relu(x), B = Neg(x), C = Add(A, B), y = Relu(C). onnxruntime visits Add's producers
    # highest stored index first, so Neg runs before Relu. Add never runs in place on the CPU.
    #   step 0 (Neg): x, B = 2S   step 1 (Relu): x, B, A = 3S (x is read again: not in place)
    #   step 2 (Add): x, B, A, C = 4S   step 3: x, C, y = 3S
    nodes = [
        node("Relu", ["x"], ["A"]),
        node("Neg", ["x"], ["B"]),
        node("Add", ["A", "B"], ["C"]),
        node("Relu", ["C"], ["y"]),
    ]
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")]))
    assert p.timeline == (2 * S, 3 * S, 4 * S, 3 * S)
    assert (p.peak_bytes, p.peak_step, p.peak_node) == (4 * S, 2, "Add_C")
    assert [t.name for t in p.live_at_peak] == ["x", "B", "A", "C"]


def test_residual_block():
    # a = Relu(x), b = Neg(a), c = Add(b, x), y = Relu(c): x stays live across the branch.
    # a dies after Neg; Add's c takes a's dead buffer (same shape) instead of a new one.
    #   step 0: x, a = 2S   step 1: x, a, b = 3S   step 2: x, b, c (in a's buffer) = 3S
    #   step 3: x, c, y = 3S. The peak is the FIRST step reaching the maximum.
    nodes = [
        node("Relu", ["x"], ["a"]),
        node("Neg", ["a"], ["b"]),
        node("Add", ["b", "x"], ["c"]),
        node("Relu", ["c"], ["y"]),
    ]
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")]))
    assert p.timeline == (2 * S, 3 * S, 3 * S, 3 * S)
    assert (p.peak_bytes, p.peak_step) == (3 * S, 1)


def test_graph_output_also_consumed_lives_to_the_end():
    # a = Relu(x) is a graph output AND read by Neg. b = Neg(a), c = Exp(b), y = Sigmoid(c).
    # Neither Neg nor Exp runs in place; Sigmoid could, but y is a graph output.
    #   step 0: x, a = 2S   step 1: x, a, b = 3S   step 2: x, a, b, c = 4S
    #   step 3: x, a, c, y = 4S
    # (were a freed after its last consumer, steps 2 and 3 would hold only 3S)
    nodes = [
        node("Relu", ["x"], ["a"]),
        node("Neg", ["a"], ["b"]),
        node("Exp", ["b"], ["c"]),
        node("Sigmoid", ["c"], ["y"]),
    ]
    p = profile(model(nodes, [value("x", [4, 8])], [value("a"), value("y")]))
    assert p.timeline == (2 * S, 3 * S, 4 * S, 4 * S)
    assert (p.peak_bytes, p.peak_step, p.peak_node) == (4 * S, 2, "Exp_c")


def test_weights_are_counted_apart_and_sizes_differ():
    # x[4,8] @ w1[8,16] -> h[4,16] (256 B) -> Relu r (256 B, in h's buffer) -> @ w2[16,8]
    # -> y[4,8] (128 B). x (128 B) is live throughout.
    #   step 0: x + h = 384   step 1: x + h/r = 384   step 2: x + r + y = 512
    # weights: 8*16*4 + 16*8*4 = 1024
    w1 = numpy_helper.from_array(np.ones((8, 16), np.float32), "w1")
    w2 = numpy_helper.from_array(np.ones((16, 8), np.float32), "w2")
    nodes = [
        node("MatMul", ["x", "w1"], ["h"]),
        node("Relu", ["h"], ["r"]),
        node("MatMul", ["r", "w2"], ["y"]),
    ]
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")], [w1, w2]))
    assert p.timeline == (384, 384, 512)
    assert (p.peak_bytes, p.peak_node) == (512, "MatMul_y")
    assert p.weight_bytes == 1024
    assert p.intermediate_bytes == 256 + 256 + 128
    assert list(p.by_op_type.items()) == [("MatMul", 384), ("Relu", 256)]
    # largest first; equal sizes keep execution order
    largest = [(t.name, t.nbytes) for t in p.largest]
    assert largest == [("h", 256), ("r", 256), ("x", 128), ("y", 128)]


def test_initializer_listed_as_graph_input_is_a_weight():
    w = numpy_helper.from_array(np.ones((4, 8), np.float32), "w")
    inputs = [value("x", [4, 8]), value("w", [4, 8])]
    m = model([node("Add", ["x", "w"], ["y"])], inputs, [value("y")], [w])
    p = profile(m)
    assert p.timeline == (2 * S,)  # x and y; w is not an activation
    assert p.weight_bytes == S


def test_constant_node_output_is_a_weight():
    # step 0 (Constant): x = S   step 1: x + y = 2S
    c = helper.make_tensor("c_value", FLOAT, [4, 8], [0.5] * 32)
    nodes = [node("Constant", [], ["c"], value=c), node("Add", ["x", "c"], ["y"])]
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")]))
    assert p.timeline == (S, 2 * S)
    assert p.weight_bytes == S
    assert p.intermediate_bytes == S
    assert "c" not in {t.name for t in p.largest}


def test_output_nobody_reads_is_held_to_the_end():
    # TopK(x[4,8], k=2) -> values float[4,2] = 32 B, indices int64[4,2] = 64 B (unread).
    # onnxruntime plans no release for a tensor nobody reads: it stays until the run ends.
    #   step 0: x + values + indices = 128 + 32 + 64 = 224   step 1: + y = 256
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    nodes = [node("TopK", ["x", "k"], ["values", "indices"]), node("Relu", ["values"], ["y"])]
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")], [k]))
    assert p.timeline == (224, 256)
    assert p.weight_bytes == 8


def test_empty_optional_names_are_ignored():
    # Clip(x, "", max): the empty optional input is no tensor.
    mx = numpy_helper.from_array(np.array(6.0, np.float32), "max")
    nodes = [node("Clip", ["x", "", "max"], ["y"])]
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")], [mx]))
    assert p.timeline == (2 * S,)
    assert p.unknown_tensors == ()


def test_symbolic_dims_are_unknown_not_zero_until_bound():
    m = model(relu_chain_nodes(), [value("x", ["batch", 8])], [value("y")])
    unbound = profile(m)
    assert unbound.unknown_tensors == ("x", "a", "b", "y")
    assert unbound.timeline == (0, 0, 0)
    bound = profile(m, batch=4)
    assert bound.unknown_tensors == ()
    assert bound.peak_bytes == 3 * S  # as test_chain: ["batch", 8] equals itself for the planner


def test_custom_domain_node_outputs_are_listed_unknown():
    # x -> Relu a -> com.microsoft Foo b (unknown) -> Relu y (unknown)
    #   step 0: x + a = 2S   step 1: x + a (+ b unknown) = 2S   step 2: x (b, y unknown) = S
    nodes = [
        node("Relu", ["x"], ["a"]),
        node("Foo", ["a"], ["b"], domain="com.microsoft"),
        node("Relu", ["b"], ["y"]),
    ]
    ms = helper.make_opsetid("com.microsoft", 1)
    p = profile(model(nodes, [value("x", [4, 8])], [value("y")], extra_opsets=[ms]))
    assert p.timeline == (2 * S, 2 * S, S)
    assert p.unknown_tensors == ("b", "y")


def test_tensor_read_inside_a_subgraph_lives_until_the_if():
    # a = Relu(x); y = If(cond) {then: Relu(a)} {else: Neg(a)}; cond is bool[] = 1 B.
    #   step 0: x, cond, a = 257   step 1: x, cond, a, y = 385
    # (a read only inside the branches; without the implicit-input rule step 1 would be 257)
    def branch(op, out):
        return helper.make_graph([helper.make_node(op, ["a"], [out])], op, [], [value(out)])

    nodes = [
        node("Relu", ["x"], ["a"]),
        node(
            "If", ["cond"], ["y"], then_branch=branch("Relu", "t"), else_branch=branch("Neg", "e")
        ),
    ]
    inputs = [value("x", [4, 8]), value("cond", [], TensorProto.BOOL)]
    p = profile(model(nodes, inputs, [value("y")]))
    assert p.timeline == (2 * S + 1, 3 * S + 1)


def test_out_of_order_nodes_are_sorted_keeping_stored_order_among_ready_ones():
    # Stored: y = Relu(b), a = Relu(x), c = Neg(x), b = Add(a, c). Ready at first: a and c;
    # stored order puts a first. onnxruntime instead walks back from y and visits Add's
    # producers highest index first: c, a, b, y.
    #   step 0 (Neg c): x, c = 2S   step 1 (Relu a): x, c, a = 3S (x read again: not in place)
    #   step 2 (Add b): x, c, a, b = 4S   step 3: x, b, y = 3S
    nodes = [
        node("Relu", ["b"], ["y"]),
        node("Relu", ["x"], ["a"]),
        node("Neg", ["x"], ["c"]),
        node("Add", ["a", "c"], ["b"]),
    ]
    m = model(nodes, [value("x", [4, 8])], [value("y")])
    assert execution_order(m.graph) == [1, 2, 3, 0]
    assert runtime_order(m.graph) == [2, 1, 3, 0]
    p = profile(m)
    assert p.timeline == (2 * S, 3 * S, 4 * S, 3 * S)
    assert p.peak_node == "Add_b"


def test_long_reversed_chain_sorts_without_recursion():
    n = 20_000
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    m = model(list(reversed(nodes)), [value("t0", [4, 8])], [value(f"t{n}")])
    assert execution_order(m.graph) == list(range(n - 1, -1, -1))
    assert runtime_order(m.graph) == list(range(n - 1, -1, -1))
    p = profile(m)
    # t0 live throughout, t1..t(n-1) all in t1's buffer (Relu in place), t(n) a graph output
    assert p.timeline == (2 * S,) * (n - 1) + (3 * S,)
    assert p.peak_node == "Relu#0"  # unnamed: op_type#stored index


def test_cycle_is_a_value_error():
    nodes = [node("Relu", ["b"], ["a"]), node("Relu", ["a"], ["b"])]
    m = model(nodes, [value("x", [4, 8])], [value("b")])
    with pytest.raises(ValueError, match="cycle"):
        execution_order(m.graph)
    with pytest.raises(ValueError, match="cycle"):
        profile(m)


def test_graph_without_nodes():
    m = model([], [value("x", [4, 8])], [value("x")])
    p = profile(m)
    assert (p.peak_bytes, p.peak_step, p.peak_node, p.timeline) == (0, -1, "", ())


# --- contrib kernels' scratch (com.microsoft, onnxruntime's CPU provider) ---------------------

MS = helper.make_opsetid("com.microsoft", 1)


def ms_node(op, inputs, outputs, **kwargs):
    return helper.make_node(op, inputs, outputs, name=f"{op}_{outputs[0]}", domain="com.microsoft", **kwargs)


def attention_model(q_shape, kv_shape, *, extra_inputs=(), extra_values=(), **attrs):
    # One MultiHeadAttention node, num_heads 4; y is declared (onnx cannot infer a contrib op).
    attrs.setdefault("num_heads", 4)
    mha = ms_node("MultiHeadAttention", ["q", "k", "v", *extra_inputs], ["y"], **attrs)
    inputs = [value("q", q_shape), value("k", kv_shape), value("v", kv_shape), *extra_values]
    return model([mha], inputs, [value("y", q_shape)], extra_opsets=[MS])


def test_attention_copies_query_key_and_value_for_flash_attention():
    # q, k, v [2, 8, 16] floats = 1 KiB each; 4 heads of 4. Flash attention (no mask, no past):
    # scratch is the [2, 4, 8, 4] copies of q, k and v = 3 KiB, beside q + k + v + y = 4 KiB, and
    # flash's per-thread blocks: 8 query rows x (2 + 8 key rows + 4) floats where the L2 cache is known.
    blocks = 4 * flash_attention_buffer(8, 8, 4, 4)
    assert blocks in (0, 4 * 8 * (2 + 8 + 4))
    p = profile(attention_model([2, 8, 16], [2, 8, 16]))
    assert p.timeline == (4 * 1024 + 3 * 1024 + blocks,)
    assert p.live_at_peak[0] == LiveTensor(WORKSPACE, 3 * 1024 + blocks, "MultiHeadAttention_y")


def test_attention_with_a_shorter_key_copies_each_at_its_own_length():
    # q [2, 8, 16] = 1 KiB, k and v [2, 4, 16] = 512 bytes each, y = 1 KiB: scratch 1 + 0.5 + 0.5 KiB.
    p = profile(attention_model([2, 8, 16], [2, 4, 16]))
    assert p.timeline == (3 * 1024 + 2 * 1024 + 4 * flash_attention_buffer(8, 4, 4, 4),)


def test_attention_with_a_mask_holds_the_probabilities():
    # A key padding mask (int32 [2, 8] = 64 bytes, a graph input) turns flash attention off:
    # besides the 3 KiB of copies, probabilities [2, 4, 8, 8] floats = 2 KiB and the output before
    # its transpose [2, 4, 8, 4] floats = 1 KiB. q + k + v + mask + y = 4 KiB + 64.
    m = attention_model([2, 8, 16], [2, 8, 16], extra_inputs=["", "mask"],
                        extra_values=[value("mask", [2, 8], TensorProto.INT32)])
    assert profile(m).timeline == (4 * 1024 + 64 + 6 * 1024,)
    # unidirectional: the same path, no mask input
    assert profile(attention_model([2, 8, 16], [2, 8, 16], unidirectional=1)).timeline == (4 * 1024 + 6 * 1024,)


def test_attention_with_key_and_value_in_heads_layout_copies_only_the_query():
    # k, v [2, 4, 8, 4] (B, N, L, H) = 1 KiB each are read in place, and that path is never
    # flash: query copy 1 KiB + probabilities [2, 4, 8, 8] = 2 KiB + output before transpose 1 KiB.
    p = profile(attention_model([2, 8, 16], [2, 4, 8, 4]))
    assert p.timeline == (4 * 1024 + 4 * 1024,)


def test_attention_of_unknown_size_has_no_scratch():
    # batch unbound: no figure for the scratch, so none is counted (the tensors are listed unknown)
    p = profile_memory(attention_model(["b", 8, 16], ["b", 8, 16]),
                       infer_shapes(attention_model(["b", 8, 16], ["b", 8, 16])))
    assert p.timeline == (0,)


@pytest.mark.parametrize(("op", "inputs", "scratch"), [
    # bias added into a temporary as big as the output: x + y + temporary = 3S
    ("BiasGelu", ["x", "bias"], S),
    ("FastGelu", ["x", "bias"], S),
    # no bias, no temporary: x + y = 2S
    ("FastGelu", ["x"], 0),
    ("Gelu", ["x"], 0),
])
def test_gelu_kernels_with_a_bias_fill_a_temporary(op, inputs, scratch):
    bias = numpy_helper.from_array(np.zeros(8, np.float32), "bias")
    m = model([ms_node(op, inputs, ["y"])], [value("x", [4, 8])], [value("y", [4, 8])], [bias], extra_opsets=[MS])
    assert profile(m).timeline == (2 * S + scratch,)


def test_repeated_walks_reuse_the_setup_and_notice_an_edit():
    # The audit walks one model once per fusion pattern with different `absent` sets: the
    # per-model setup is reused, and a model edited in place between walks is set up again.
    m = model(relu_chain_nodes(), [value("x", [4, 8])], [value("y")])
    shapes = infer_shapes(m)
    assert profile_memory(m, shapes, symbolic_shapes=shapes).timeline == (2 * S, 2 * S, 3 * S)
    # no a to share
    assert profile_memory(m, shapes, symbolic_shapes=shapes, absent={"a"}).timeline == (S, 2 * S, 3 * S)
    m.graph.node[1].op_type = "Exp"  # Exp has no in-place kernel: b takes a buffer of its own
    assert profile_memory(m, shapes, symbolic_shapes=shapes).timeline == (2 * S, 3 * S, 3 * S)


# --- what walks share: one graph per model, one plan per order and `absent`, sizes per table ----


@pytest.fixture
def cold():
    """A profile computed with the memory model's caches emptied first (and after): what each
    shared or cached result must equal."""
    from fuse_cli.analysis import memory

    def walk(m, shapes, **kwargs):
        memory._GRAPHS.clear()
        memory._NODE_FIELDS.clear()
        try:
            return profile_memory(m, shapes, **kwargs)
        finally:
            memory._GRAPHS.clear()
            memory._NODE_FIELDS.clear()
    yield walk
    memory._GRAPHS.clear()
    memory._NODE_FIELDS.clear()


def branchy_model(exp_op="Exp"):
    # Branches that meet twice, a symbolic batch, in-place candidates (Sigmoid over Relu's output,
    # Softmax), a view (Reshape), a graph output read again, and a scalar.
    nodes = [
        node("Relu", ["x"], ["a"]), node("Sigmoid", ["a"], ["b"]), node(exp_op, ["x"], ["c"]),
        node("Reshape", ["c", "shape"], ["d"]), node("Add", ["b", "d"], ["e"]), node("Softmax", ["e"], ["f"]),
        node("Mul", ["a", "f"], ["y"]), node("Concat", ["f", "y"], ["z"], axis=0),
        node("ReduceSum", ["z"], ["s"], keepdims=0),
    ]
    shape = numpy_helper.from_array(np.array([-1, 8], dtype=np.int64), "shape")
    return model(nodes, [value("x", ["batch", 8])], [value("y"), value("z"), value("s")], [shape])


def test_one_walk_at_several_settings_equals_a_walk_at_each(cold):
    from fuse_cli.analysis.memory import profile_memory_at

    m = branchy_model()
    symbolic = infer_shapes(m)
    tables = [infer_shapes(m, dims={"batch": batch}) for batch in (2, 16)]
    shared = profile_memory_at(m, tables, symbolic_shapes=symbolic)
    assert shared == tuple(cold(m, table, symbolic_shapes=symbolic) for table in tables)
    assert shared[0].peak_bytes < shared[1].peak_bytes


def test_orders_and_absent_sets_on_a_set_up_model_equal_each_walked_cold(cold):
    m = branchy_model()
    symbolic, table = infer_shapes(m), infer_shapes(m, dims={"batch": 4})
    stored = list(range(len(m.graph.node)))
    other = [2, 3, 0, 1, 4, 5, 6, 7, 8]  # the Exp branch first
    cases = [dict(), dict(order=stored), dict(absent={"a"}), dict(order=other), dict(),
             dict(absent={"c", "e"}), dict(order=other, absent={"a"}), dict(absent={"a"})]
    for kwargs in cases:
        warm = profile_memory(m, table, symbolic_shapes=symbolic, **kwargs)
        assert warm == cold(m, table, symbolic_shapes=symbolic, **kwargs), kwargs
    # the orders are walks of their own, not one reused
    assert profile_memory(m, table, symbolic_shapes=symbolic, order=other) != \
        profile_memory(m, table, symbolic_shapes=symbolic, order=stored)


def test_a_candidate_sharing_most_nodes_with_the_original_equals_it_walked_cold(cold):
    original, candidate = branchy_model(), branchy_model(exp_op="Tanh")  # Tanh may run in place, Exp may not
    table = infer_shapes(candidate, dims={"batch": 4})
    profile_memory(original, infer_shapes(original, dims={"batch": 4}))
    assert profile_memory(candidate, table) == cold(candidate, table)


def test_largest_tensors_are_what_nlargest_over_birth_order_gives():
    import heapq

    from fuse_cli.analysis.memory import _LARGEST_COUNT, _largest

    rng = np.random.default_rng(0)
    for count in (0, 3, _LARGEST_COUNT, 50, 400):
        names = [f"t{i}" for i in range(count)]
        producer = dict.fromkeys(rng.permutation(names).tolist(), "node")
        known = {n: int(rng.integers(0, 4)) * 64 for n in names if rng.random() < 0.9}  # many ties, a few unknown
        expected = heapq.nlargest(_LARGEST_COUNT, (n for n in producer if n in known), key=known.__getitem__)
        assert _largest(producer, known) == expected


def test_the_fingerprint_notices_an_initializer_edited_in_place():
    from fuse_cli.core.order import model_fingerprint

    m = branchy_model()
    before = model_fingerprint(m)
    m.graph.initializer[0].dims[0] = 1
    after_dims = model_fingerprint(m)
    m.graph.initializer[0].data_type = TensorProto.INT32
    assert len({before, after_dims, model_fingerprint(m)}) == 3


def shape_then(reader: str, dims) -> object:
    """x -> Relu -> r; y = reader(r, Shape(r)) (Reshape), or reader(Concat(Shape(r)[0:1], [16, 8, 8])): what
    onnxruntime's own inference makes of a shape read from a Shape node."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"])]
    initializers = []
    if reader == "concat":
        initializers = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                        numpy_helper.from_array(np.array([1], np.int64), "one"),
                        numpy_helper.from_array(np.array([16, 8, 8], np.int64), "rest")]
        nodes += [helper.make_node("Slice", ["s", "zero", "one"], ["b"]),
                  helper.make_node("Concat", ["b", "rest"], ["target"], axis=0)]
    nodes.append(helper.make_node("Reshape", ["r", "target" if reader == "concat" else "s"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("reader", "dims", "known"), [
    ("shape", [2, 16, 8, 8], True),        # a Shape of known dims: its direct reader sees the constant
    ("shape", ["batch", 16, 8, 8], False),  # a symbol: nothing
    ("concat", [2, 16, 8, 8], False),       # arithmetic on it: nothing, even over known dims
])
def test_onnxruntime_reads_a_shape_of_known_dims_and_nothing_else(reader, dims, known):
    import onnxruntime as ort

    model = shape_then(reader, dims)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    inferred = session.get_outputs()[0].shape  # onnxruntime's own inference of y
    assert all(isinstance(d, int) for d in inferred) == known, inferred
    y = planner_shapes(model)["y"]
    assert (y.shape is not None and all(isinstance(d, int) for d in y.shape)) == known, y
