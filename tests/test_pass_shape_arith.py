"""static-reshape-shape: Reshape shapes computed from Shape at run time (torch dynamic axes) -> constants."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fuse_cli.verify import verify_models
from tests.attention_graphs import attention_model
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts, signature

PASS = ("static-reshape-shape",)
SIZES = ({"batch": 1, "sequence": 3}, {"batch": 3, "sequence": 5})
I64 = np.int64


def ints(values) -> np.ndarray:
    return np.array(values, I64)


def dim(b: GraphBuilder, t: str, i: int, form: str = "unsqueeze") -> str:
    """torch's x.size(i) as a 1-D piece: Unsqueeze(Gather(Shape(t), i)) (axes an input from opset 13),
    Reshape(Gather(...), [1]), or Gather(Shape(t), [i])."""
    if form == "gather-vector":
        return b.op("Gather", b.op("Shape", t), b.const(ints([i])))
    scalar = b.op("Gather", b.op("Shape", t), b.const(ints(i)))
    if form == "reshape":
        return b.op("Reshape", scalar, b.const(ints([1])))
    if b.opset >= 13:
        return b.op("Unsqueeze", scalar, b.const(ints([0])))
    return b.op("Unsqueeze", scalar, axes=[0])


def concat(b: GraphBuilder, *pieces) -> str:
    return b.op("Concat", *(p if isinstance(p, str) else b.const(ints(p)) for p in pieces), axis=0)


def model(x_shape, shape_of, *, opset: int = 17, project: bool = False, others=(), **attrs) -> onnx.ModelProto:
    """input ─ Neg (or MatMul by a [32, 64] weight) ─ t ─ Reshape(t, shape_of(b, input, t)) ─ Relu ─ y."""
    b = GraphBuilder(opset=opset)
    inp = b.input("input", list(x_shape))
    for name, shape in others:
        b.input(name, shape)
    t = b.op("MatMul", inp, b.const(b.rand(32, 64)), name="project") if project else b.op("Neg", inp, name="neg")
    return b.build(b.op("Relu", b.op("Reshape", t, shape_of(b, inp, t), name="reshape", **attrs)), output_names=["y"])


BSH = ("batch", "sequence", 64)
POSITIVE = {
    "head-split": (BSH, lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [4, 16]), {}, [0, 0, 4, 16]),
    "head-split-opset11-axes-attribute": (BSH, lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [4, 16]),
                                          {"opset": 11}, [0, 0, 4, 16]),
    "head-split-reshaped-scalar": (BSH, lambda b, i, t: concat(b, dim(b, t, 0, "reshape"), dim(b, t, 1, "reshape"),
                                                              [4, 16]), {}, [0, 0, 4, 16]),
    "head-split-gather-indices": (BSH, lambda b, i, t: concat(b, b.op("Gather", b.op("Shape", t),
                                                                      b.const(ints([0, 1]))), [4, 16]),
                                  {}, [0, 0, 4, 16]),
    "head-split-slice": (BSH, lambda b, i, t: concat(b, b.op("Slice", b.op("Shape", t), b.const(ints([0])),
                                                             b.const(ints([-1]))), [4, 16]), {}, [0, 0, 4, 16]),
    "head-split-opset9-slice-attributes": (BSH, lambda b, i, t: concat(b, b.op("Slice", b.op("Shape", t), starts=[0],
                                                                              ends=[2]), [4, 16]),
                                           {"opset": 9}, [0, 0, 4, 16]),
    "head-split-opset15-shape-start-end": (BSH, lambda b, i, t: concat(b, b.op("Shape", t, start=0, end=-1), [4, 16]),
                                           {"opset": 15}, [0, 0, 4, 16]),
    "head-split-allowzero-0": (BSH, lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [4, 16]),
                               {"allowzero": 0}, [0, 0, 4, 16]),
    "dims-of-the-projected-input": (("batch", "sequence", 32), lambda b, i, t: concat(b, dim(b, i, 0), dim(b, i, 1),
                                                                                     [4, 16]),
                                    {"project": True}, [0, 0, 4, 16]),
    "merge-heads": (("batch", "sequence", 4, 16), lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [64]), {},
                    [0, 0, 64]),
    "merge-heads-product": (("batch", "sequence", 4, 16),
                            lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1),
                                                   b.op("Unsqueeze", b.op("Mul", b.op("Gather", b.op("Shape", t),
                                                                                      b.const(ints(2))),
                                                                          b.op("Gather", b.op("Shape", t),
                                                                               b.const(ints(3)))),
                                                        b.const(ints([0])))), {}, [0, 0, 64]),
    "head-split-heads-minus-one": (BSH, lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [-1, 16]), {},
                                   [0, 0, 4, 16]),
    "merge-heads-minus-one": (("batch", "sequence", 4, 16), lambda b, i, t: concat(b, dim(b, i, 0), dim(b, i, 1), [-1]),
                              {}, [0, 0, 64]),
    "minus-one-left-over": (("batch", "sequence", 64), lambda b, i, t: concat(b, dim(b, t, 0), [-1, 16]), {},
                            [0, -1, 16]),
    "static-dim": (("batch", 3, 4), lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 2), [3]), {}, [0, 4, 3]),
    "other-position-becomes-minus-one": (("batch", 6), lambda b, i, t: concat(b, [2], dim(b, t, 0), [3]), {},
                                         [2, -1, 3]),
    "allowzero-1-one-unknown": (("batch", 8, 64), lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [4, 16]),
                                {"allowzero": 1}, [-1, 8, 4, 16]),
    "whole-shape-of-another-tensor": (("batch", 64), lambda b, i, t: b.op("Shape", b.op("Neg", t)), {}, [0, 64]),
    # MobileViT's unfold: [B * C * h, ph, w, pw], the product computed from Shape(t)[0]
    "product-of-a-dim": (("batch", 8, 4, 4), lambda b, i, t: concat(
        b, b.op("Unsqueeze", b.op("Mul", b.op("Gather", b.op("Shape", t), b.const(ints(0))), b.const(ints(16))),
                b.const(ints([0]))), [2, 2, 2]), {}, [-1, 2, 2, 2]),
}


def reshape_shape(m: onnx.ModelProto) -> list[int]:
    (node,) = [n for n in m.graph.node if n.op_type == "Reshape"]
    (shape,) = [t for t in m.graph.initializer if t.name == node.input[1]]
    return numpy_helper.to_array(shape).tolist()


@pytest.mark.parametrize("case", POSITIVE)
def test_computed_shape_becomes_constant(case, tmp_path):
    x_shape, shape_of, options, expected = POSITIVE[case]
    original = model(x_shape, shape_of, **options)
    result = optimize_model(original, tmp_path, passes=PASS)
    assert reshape_shape(result.model) == expected
    pre = "MatMul" if options.get("project") else "Neg"
    assert op_counts(result.model) == {pre: 1, "Reshape": 1, "Relu": 1}  # the whole Shape chain is gone
    for dims in SIZES:
        assert_equivalent(original, result.model, dims=dims)
    again = optimize_model(result.model, tmp_path, name="again", passes=PASS)
    assert not again.report.fusions and not again.report.near_misses


@pytest.mark.parametrize("x_shape, shape_of, options, reason", [
    (BSH, lambda b, i, t: concat(b, dim(b, "other", 0), [-1, 4, 16]), {"others": [("other", ["rows", 5])]},
     "entry 0 (dim 0 of 'other', 'rows', is not provably 'neg_out''s dim 0, 'batch') (the shape already has a -1)"),
    (BSH, lambda b, i, t: concat(b, dim(b, t, 0), dim(b, t, 1), [4, 16]), {"allowzero": 1, "opset": 14},
     "entry 0 (dim 0 of 'neg_out', 'batch', is not provably 'neg_out''s dim 0, 'batch'); entry 1 (dim 1 of "
     "'neg_out', 'sequence', is not provably 'neg_out''s dim 1, 'sequence') (allowzero=1, so 0 cannot copy a dim; "
     "at most one can be left to -1)"),
    (BSH, lambda b, i, t: concat(b, dim(b, t, 1), dim(b, t, 0), [64]), {},
     "entry 0 (dim 1 of 'neg_out', 'sequence', is not provably 'neg_out''s dim 0, 'batch'); entry 1 (dim 0"),
], ids=["dim-of-unrelated-tensor", "allowzero-1", "two-unknown-entries"])
def test_shape_not_provably_static_is_a_near_miss(x_shape, shape_of, options, reason, tmp_path):
    original = model(x_shape, shape_of, **options)
    result = optimize_model(original, tmp_path, passes=PASS)
    assert not result.report.fusions and signature(result.model) == signature(original)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == PASS[0]]
    assert miss.startswith("reshape's shape is known only at run time in ") and reason in miss


@pytest.mark.parametrize("form", ["input", "arithmetic-of-an-input"])
def test_shape_from_data_is_not_this_pattern(form, tmp_path):
    def target(b, i, t):
        if form == "input":
            return b.input("target", [4], onnx.TensorProto.INT64)
        rows = b.input("rows", [1], onnx.TensorProto.INT64)
        return concat(b, b.op("Mul", rows, b.const(ints([4]))), [4, 16])
    original = model(BSH, target)
    result = optimize_model(original, tmp_path, passes=PASS)
    assert not result.report.fusions and not result.report.near_misses


# --- attention written with computed shapes, through the whole onnxruntime pipeline --------------

MHA = "com.microsoft::MultiHeadAttention"
ATTENTION_SIZES = ({"batch": 1, "sequence": 3}, {"batch": 3, "sequence": 8})


def torch_dynamic_shapes(m: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """Every Reshape's constant shape [0, x, rest...] replaced by what torch writes with dynamic axes:
    Concat(Unsqueeze(Gather(Shape(data), 0)), Unsqueeze(Gather(Shape(data), 1)), rest), read from the
    Reshape's own input (the projection's Add output, the merge Transpose's output)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    values = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    nodes = []
    for node in m.graph.node:
        if node.op_type == "Reshape" and node.input[1] in values:
            data, p = node.input[0], node.name
            rest = values[node.input[1]][2:]
            m.graph.initializer.extend([numpy_helper.from_array(ints(i), f"{p}_i{i}") for i in (0, 1)]
                                       + [numpy_helper.from_array(ints(rest), f"{p}_rest"),
                                          numpy_helper.from_array(ints([0]), f"{p}_axes")])
            for i in (0, 1):
                nodes.append(helper.make_node("Shape", [data], [f"{p}_shape{i}"]))
                nodes.append(helper.make_node("Gather", [f"{p}_shape{i}", f"{p}_i{i}"], [f"{p}_dim{i}"]))
                inputs, attrs = ([f"{p}_dim{i}", f"{p}_axes"], {}) if opset >= 13 else ([f"{p}_dim{i}"], {"axes": [0]})
                nodes.append(helper.make_node("Unsqueeze", inputs, [f"{p}_piece{i}"], **attrs))
            pieces = [f"{p}_piece0", f"{p}_piece1", f"{p}_rest"]
            nodes.append(helper.make_node("Concat", pieces, [f"{p}_computed"], axis=0))
            node.input[1] = f"{p}_computed"
        nodes.append(node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


# what attention says without this pass: the merge's Shape read blocks it, or the head count is unknown
READ_BY_SHAPE = "merge_transpose's output 'merge_transpose_out' is also read by an unnamed Shape"
ATTENTION = {
    "torch-dynamic-axes-opset17": torch_dynamic_shapes(attention_model(mask="padding"), 17),
    "torch-dynamic-axes-opset14": torch_dynamic_shapes(attention_model(opset=14, mask="padding", softmax_axis=3), 14),
    "torch-dynamic-axes-opset12": torch_dynamic_shapes(attention_model(opset=12), 12),
    "slice-of-input-shape": attention_model(split_shape="concat", mask="padding"),
    # The rewritten Reshapes leave their Shape chains dead; the engine drops them at the end of the
    # sweep, so fused-matmul cannot take the score Mul before attention sees the whole pattern.
    "torch-dynamic-axes-scale-mul": torch_dynamic_shapes(attention_model(mask="padding", scale="mul"), 17),
}


@pytest.mark.parametrize("original", ATTENTION.values(), ids=ATTENTION.keys())
def test_attention_with_computed_shapes_fuses_in_the_runtime_pipeline(original, tmp_path):
    result = optimize_model(original, tmp_path, target="ort-cpu", disable=("packed-attention",))
    counts = op_counts(result.model)
    assert counts[MHA] == 1 and not {"Softmax", "Transpose", "Reshape"} & set(counts), counts
    (node,) = [n for n in result.model.graph.node if n.op_type == "MultiHeadAttention"]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"num_heads": 4}
    # Without this pass attention still fuses: it judges the computed split and merge shapes by the
    # Reshapes' inferred output shapes ([batch, sequence, 4, 16] from [batch, sequence, 64]).
    without = optimize_model(original, tmp_path, name="without", target="ort-cpu",
                             disable=(*PASS, "packed-attention"))
    assert op_counts(without.model)[MHA] == 1
    for fused in (result.model, without.model):
        for dims in ATTENTION_SIZES:
            outcome = verify_models(original, fused, dims=dims, rtol=1e-4, atol=1e-5,
                                    int_ranges={"attention_mask": (0, 2)})
            assert outcome.passed, outcome.outputs


# --- torch's Conv1D: the back-reshape copies leading dims of the input, not of the Gemm output ---

def conv1d(*, opset: int = 17, shared: bool = False) -> onnx.ModelProto:
    """input [batch, sequence, 32] ─ Reshape[-1, 32] ─ Gemm(W, b) ─ Reshape(Concat(input.size(0),
    input.size(1), [64])) ─ Relu ─ y; `shared`: the two size pieces are also a graph output."""
    b = GraphBuilder(opset=opset)
    x = b.input("input", ["batch", "sequence", 32])
    flat = b.op("Reshape", x, b.const(ints([-1, 32])), name="flatten")
    y = b.op("Gemm", flat, b.const(b.rand(32, 64)), b.const(b.rand(64)), name="gemm")
    pieces = dim(b, x, 0), dim(b, x, 1)
    back = b.op("Reshape", y, concat(b, *pieces, [64]), name="reshape")
    outputs = [b.op("Relu", back)] + ([concat(b, *pieces)] if shared else [])
    return b.build(*outputs, output_names=["y", "sizes"][:len(outputs)])


def test_leading_dims_of_another_tensor_become_one_shape_slice(tmp_path):
    original = conv1d()
    result = optimize_model(original, tmp_path, passes=PASS)
    assert op_counts(original)["Gather"] == 2
    assert op_counts(result.model) == {"Reshape": 2, "Gemm": 1, "Shape": 1, "Concat": 1, "Relu": 1}
    (shape,) = [n for n in result.model.graph.node if n.op_type == "Shape"]
    assert list(shape.input) == ["input"]
    assert {a.name: helper.get_attribute_value(a) for a in shape.attribute} == {"start": 0, "end": 2}
    for dims in SIZES:
        assert_equivalent(original, result.model, dims=dims)
    again = optimize_model(result.model, tmp_path, name="again", passes=PASS)
    assert not again.report.fusions and not again.report.near_misses


def test_leading_dims_read_elsewhere_gain_nothing_and_stay(tmp_path):
    original = conv1d(shared=True)
    result = optimize_model(original, tmp_path, passes=PASS)
    assert not result.report.fusions and signature(result.model) == signature(original)
    assert not [m for m in result.report.near_misses if m.pass_name == PASS[0]]


def test_leading_dims_before_opset_15_stay_a_near_miss(tmp_path):
    original = conv1d(opset=14)
    result = optimize_model(original, tmp_path, passes=PASS)
    assert not result.report.fusions and signature(result.model) == signature(original)
    (miss,) = [m.reason for m in result.report.near_misses if m.pass_name == PASS[0]]
    assert "entry 0 (dim 0 of 'input', 'batch', is not provably 'gemm_out''s dim 0" in miss
