"""The Casts onnxruntime's CPU provider inserts around float16 nodes, replayed by the memory walk
(analysis/inserted_casts.py, ops/cpu_float16.py), against the installed onnxruntime: its table of
float16 kernels, the graph it really runs (its saved graph at graph optimization disabled), and
the peak that graph reaches."""

from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis import walk_setup as setups
from fuse_cli.analysis.inserted_casts import CAST_PREFIX
from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.shapes import infer_shapes
from fuse_cli.ops.cpu_float16 import STANDARD_FLOAT16_KERNELS, has_cpu_float16_kernel
from tests.conftest import saved_by_onnxruntime

F16, F32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT64
MIB = 1 << 20


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _weight(name, shape, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
    return numpy_helper.from_array(values, name)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", opset)])


def _io(name, elem_type, shape=None):
    return helper.make_tensor_value_info(name, elem_type, shape)


# ---- the table of float16 kernels ----

# One-node probes: operator, inputs (name, type; a name in INITS is a small weight), outputs, opset,
# attributes. Every row of STANDARD_FLOAT16_KERNELS that a probe covers, at an opset inside its
# range, plus operators without a float16 kernel and ranges' edges.
INITS = {"axes": _ints("axes", [0]), "shape": _ints("shape", [-1]), "idx": _ints("idx", [0]),
         "starts": _ints("starts", [0]), "ends": _ints("ends", [1]), "split": _ints("split", [1, 1]),
         "reps": _ints("reps", [1, 1]), "pads": _ints("pads", [0, 0, 0, 0])}
X, Y, Z = ("x", F16), ("y", F16), ("z", F16)
PROBES = [
    ("Cast", [X], [("y", F32)], 17, {"to": F32}), ("Concat", [X, Y], [Z], 17, {"axis": 0}),
    ("Expand", [X, ("shape", I64)], [Y], 17, {}), ("Flatten", [X], [Y], 17, {}),
    ("Gather", [X, ("idx", I64)], [Y], 17, {}), ("GatherElements", [X, ("i", I64)], [Y], 17, {}),
    ("Identity", [X], [Y], 17, {}), ("Reshape", [X, ("shape", I64)], [Y], 17, {}),
    ("Shape", [X], [("y", I64)], 17, {}), ("Slice", [X, ("starts", I64), ("ends", I64)], [Y], 17, {}),
    ("Split", [X, ("split", I64)], [Y, Z], 17, {}), ("Squeeze", [X, ("axes", I64)], [Y], 17, {}),
    ("Unsqueeze", [X, ("axes", I64)], [Y], 17, {}), ("Unsqueeze", [X], [Y], 11, {"axes": [0]}),
    ("Transpose", [X], [Y], 17, {}), ("ScatterND", [X, ("i", I64), Y], [Z], 17, {}),
    ("Where", [("c", TensorProto.BOOL), X, Y], [Z], 17, {}), ("Sign", [X], [Y], 17, {}),
    ("Round", [X], [Y], 17, {}), ("IsNaN", [X], [("y", TensorProto.BOOL)], 17, {}),
    ("Clip", [X], [Y], 11, {}), ("Clip", [X], [Y], 13, {}), ("Max", [X, Y], [Z], 11, {}),
    ("Max", [X, Y], [Z], 13, {}), ("Min", [X, Y], [Z], 13, {}),
    ("Dropout", [X], [Y], 11, {}), ("Dropout", [X], [Y], 13, {}),
    ("LayerNormalization", [X, Y, Z], [("w", F16)], 17, {}),
    ("LayerNormalization", [X, Y, Z], [("w", F16)], 14, {}),
    ("MatMul", [X, Y], [Z], 17, {}), ("Add", [X, Y], [Z], 17, {}), ("Mul", [X, Y], [Z], 17, {}),
    ("Softmax", [X], [Y], 17, {}), ("Relu", [X], [Y], 17, {}), ("Erf", [X], [Y], 17, {}),
    ("Tile", [X, ("reps", I64)], [Y], 17, {}), ("Pad", [X, ("pads", I64)], [Y], 17, {}),
    ("ReduceMean", [X], [Y], 17, {"axes": [1]}), ("Sqrt", [X], [Y], 17, {}), ("Gelu", [X], [Y], 20, {}),
    ("Size", [X], [("y", I64)], 17, {}), ("Equal", [X, Y], [("z", TensorProto.BOOL)], 17, {}),
]


@pytest.mark.parametrize("op, inputs, outputs, opset, attrs", PROBES,
                         ids=[f"{p[0]}-{p[3]}" for p in PROBES])
def test_the_float16_kernel_table_is_what_the_runtime_runs(op, inputs, outputs, opset, attrs, tmp_path):
    node = helper.make_node(op, [name for name, _ in inputs], [name for name, _ in outputs], **attrs)
    graph_inputs = [_io(name, t) for name, t in inputs if name not in INITS]
    initializers = [INITS[name] for name, _ in inputs if name in INITS]
    runtime = saved_by_onnxruntime(_model([node], graph_inputs, [_io(n, t) for n, t in outputs], initializers, opset),
                             tmp_path)
    casts = [n for n in runtime.graph.node if n.op_type == "Cast" and n.name.startswith("InsertedPrecisionFreeCast_")]
    assert has_cpu_float16_kernel("", op, opset) == (not casts), [n.name for n in casts]


def test_every_row_of_the_table_with_a_kernel_is_probed_or_a_type_agnostic_one():
    probed = {p[0] for p in PROBES}
    # rows the probes above leave out: data movement registered for every type, and control flow
    unprobed = set(STANDARD_FLOAT16_KERNELS) - probed
    assert unprobed <= {"CastLike", "Compress", "Constant", "ConstantOfShape", "GatherND", "OptionalGetElement",
                        "ReverseSequence", "Scatter", "ScatterElements", "If", "Loop", "Scan", "Mod", "Shrink",
                        "IsInf", "ReduceLogSumExp", "DequantizeLinear", "QuantizeLinear"}, unprobed


def test_recorded_operators_follow_their_records():
    assert has_cpu_float16_kernel("com.microsoft", "SkipLayerNormalization", 17)
    assert not has_cpu_float16_kernel("com.microsoft", "FusedMatMul", 17)
    assert not has_cpu_float16_kernel("com.microsoft", "Attention", 17)
    assert has_cpu_float16_kernel("", "SimplifiedLayerNormalization", 14)
    assert has_cpu_float16_kernel("some.vendor", "Anything", 17)  # nothing known: no Cast assumed


# ---- the graph onnxruntime runs ----

def _block(opset=17):
    """A float16 block with every rule in play: an embedding Gather of a weight, indexed by a
    node's output, and a Transpose between two nodes without float16 kernels (both isolated, so
    run in float32), MatMul/Add/Mul without float16 kernels, a float16 -> float16 Cast between cast
    nodes (stays), a LayerNormalization (a kernel) between cast nodes (isolated), a float32 input
    cast down to float16 by the model itself (that Cast and the inserted one after it cancel), a
    Reshape feeding a Transpose (kept in float16), a Relu writing a graph output, and a Shape of a
    float16 tensor (a kernel)."""
    d = 16
    inits = [_weight("emb", [32, d], 1), _weight("w1", [d, d], 2), _weight("b1", [d], 3), _weight("w2", [d, d], 4),
             _weight("g", [d], 5), _weight("beta", [d], 6), _ints("heads", [0, 0, 2, d // 2])]
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=I64, name="index"),
        helper.make_node("Gather", ["emb", "ids64"], ["e"], name="embed"),
        helper.make_node("MatMul", ["e", "w1"], ["m1"], name="mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
        helper.make_node("Transpose", ["a1"], ["t1"], perm=[1, 0, 2], name="swap"),
        helper.make_node("MatMul", ["t1", "w2"], ["m2"], name="mm2"),
        helper.make_node("Cast", ["m2"], ["m3"], to=F16, name="same_type"),
        helper.make_node("Mul", ["m3", "g"], ["sc"], name="scale"),
        helper.make_node("LayerNormalization", ["sc", "g", "beta"], ["ln"], name="norm"),
        helper.make_node("Cast", ["extra"], ["extra16"], to=F16, name="down"),
        helper.make_node("Add", ["ln", "extra16"], ["s"], name="residual"),
        helper.make_node("Reshape", ["s", "heads"], ["r"], name="split_heads"),
        helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 1, 3], name="heads_first"),
        helper.make_node("Relu", ["rt"], ["out"], name="act"),
        helper.make_node("Shape", ["s"], ["s_shape"], name="shape"),
    ]
    inputs = [_io("ids", TensorProto.INT32, ["batch", "sequence"]), _io("extra", F32, ["sequence", "batch", d])]
    outputs = [_io("out", F16), _io("s_shape", I64)]
    return _model(nodes, inputs, outputs, inits, opset)


def _walked(model):
    setup = setups.walk_setup(model, infer_shapes(model), (), None, "cpu")
    graph = setup.graph
    return sorted((graph.op_types[i], tuple(graph.inputs[i]), tuple(graph.outputs[i]))
                  for i in range(len(graph.labels)))


@pytest.mark.parametrize("opset", [14, 17])
def test_the_walk_runs_the_graph_onnxruntime_runs(opset, tmp_path):
    model = _block(opset)
    runtime = saved_by_onnxruntime(model, tmp_path)
    expected = sorted((n.op_type, tuple(n.input), tuple(n.output)) for n in runtime.graph.node)
    walked = _walked(model)
    assert walked == expected
    # the rules the block is built to exercise did fire: the isolated nodes run in float32
    in_float32 = {op for op, _, outputs in walked if op != "Cast" and outputs[0].startswith(CAST_PREFIX)}
    assert {"Gather", "Transpose", "LayerNormalization", "MatMul", "Relu"} <= in_float32


def test_nothing_is_inserted_for_float32_or_float16_kernels_only():
    d = 8
    float32 = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_io("x", F32, [2, d])], [_io("y", F32)],
                     [numpy_helper.from_array(np.ones((d, d), np.float32), "w")])
    kernels_only = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                           helper.make_node("Reshape", ["t", "shape"], ["y"])],
                          [_io("x", F16, [2, d])], [_io("y", F16)], [_ints("shape", [-1])])
    for model in (float32, kernels_only):
        graph = setups.walk_setup(model, infer_shapes(model), (), None, "cpu").graph
        assert graph.stored == [] and graph.float_copies == {}


# ---- the peak ----

def _float16_mlp(width=512, layers=4):
    inits = [_weight(f"w{i}", [width, width], i) for i in range(layers)]
    nodes, current = [], "x"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        current = f"r{i}"
    return _model(nodes, [_io("x", F16, ["batch", width])], [_io(current, F16)], inits)


def test_the_cpu_estimate_counts_the_float32_copies_onnxruntime_holds():
    """Every weight's Cast reads only the weight, so onnxruntime's order runs them all first and
    holds a float32 copy of each (4 x 1 MiB here) until its MatMul: the CPU walk counts them, a
    walk of the stored nodes (CUDA's, which has float16 kernels) does not."""
    model = _float16_mlp()
    shapes = infer_shapes(model, dims={"batch": 64})
    cpu = profile_memory(model, shapes, provider="cpu").peak_bytes
    cuda = profile_memory(model, shapes, provider="cuda").peak_bytes
    assert cpu > cuda + 3 * MIB
    measured = measure_peak(model, dims={"batch": 64})
    if measured.peak_bytes is None:
        pytest.skip(f"cannot measure here: {measured.reason}")
    assert abs(cpu - measured.peak_bytes) <= 0.15 * measured.peak_bytes, (cpu, measured.peak_bytes)
    assert measured.peak_bytes > 1.5 * cuda


def test_absent_tensors_take_their_float32_copies_with_them():
    model = _float16_mlp(width=256, layers=2)
    shapes = infer_shapes(model, dims={"batch": 512})
    whole = profile_memory(model, shapes)
    without = profile_memory(model, shapes, absent={"h0", "r0"})
    walked = setups.walk_setup(model, infer_shapes(model), (), None, "cpu").graph
    # MatMul and Relu both run in float32: the Relu reads the MatMul's float32 output directly
    assert walked.float_copies["InsertedPrecisionFreeCast_h0"] == "h0"
    assert without.peak_bytes < whole.peak_bytes
    assert all(t.name not in ("InsertedPrecisionFreeCast_h0", "InsertedPrecisionFreeCast_r0")
               for t in without.live_at_peak)


def _reshaped_to_a_computed_shape(d: int, declared_output=None) -> onnx.ModelProto:
    """x [batch, sequence, d] float16, transposed, then reshaped to a shape computed from Shape(x)
    (onnx's data propagation names its dims, onnxruntime's inference does not), MatMul, Relu."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["leading"]),
        helper.make_node("Concat", ["leading", "width"], ["target"], axis=0),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("Reshape", ["xt", "target"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["y"]),
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    return _model(nodes, [_io("x", F16, ["batch", "sequence", d])], [_io("out", F16, declared_output)],
                  [_weight("w", [d, d]), _ints("zero", [0]), _ints("two", [2]), _ints("width", [d])])


def test_a_float32_copy_takes_the_shape_onnxruntime_gives_its_source():
    """onnxruntime's planner reuses a dead buffer for a tensor of the same shape as its own
    inference gives it. A Reshape to a computed shape leaves that inference without the dims onnx's
    data propagation finds, and the float32 copy of what follows has the dims its float16 source has
    there: not the data-propagated ones (with those, a float16 Gemma's copies took held buffers
    onnxruntime does not hold: estimate 27.3 MiB against 14.2 allocated, now 14.1)."""
    d = 16
    model = _reshaped_to_a_computed_shape(d)
    symbolic = infer_shapes(model)
    assert symbolic.get("y").shape == ("batch", "sequence", d)  # onnx's data propagation sees through the Reshape
    graph = setups.walk_setup(model, symbolic, (), None, "cpu").graph
    stored = setups.walk_setup(model, symbolic, (), None, "cuda").graph  # the nodes as stored
    copy = CAST_PREFIX + "y"
    assert graph.float_copies[copy] == "y"
    assert graph.planner_shapes[copy].shape == stored.planner_shapes["y"].shape
    assert graph.planner_shapes[copy].shape != symbolic.get("y").shape


def test_a_float32_output_is_shaped_by_inference_not_by_the_declaration_of_its_float16_tensor():
    """A node run in float32 writes a new tensor, which onnxruntime shapes by inference on the graph
    it runs: the declaration of the float16 output (here a graph output's) is not its. Measured on
    a float16 Gemma fused at batch 16: given the declared shapes, the walk found buffers to share
    that onnxruntime does not, 17.4 MiB against 21.4 allocated; shaped by inference, 21.4."""
    d = 16
    model = _reshaped_to_a_computed_shape(d, declared_output=["batch", "sequence", d])
    graph = setups.walk_setup(model, infer_shapes(model), (), None, "cpu").graph
    relu_output = CAST_PREFIX + "out"
    assert graph.float_copies[relu_output] == "out"
    assert graph.planner_shapes[relu_output].shape == graph.planner_shapes[CAST_PREFIX + "y"].shape
    assert graph.planner_shapes[relu_output].shape != ("batch", "sequence", d)


def test_a_stored_order_walks_each_weights_cast_right_before_its_reader():
    """A scheduler's order (a runtime that follows the stored order) runs an inserted Cast of a
    weight right before the node reading it: one float32 weight copy alive at a time, not all."""
    model = _float16_mlp(width=512, layers=4)
    shapes = infer_shapes(model, dims={"batch": 8})
    runtime = profile_memory(model, shapes)
    stored = profile_memory(model, shapes, order=list(range(len(model.graph.node))))
    copy_bytes = 512 * 512 * 4
    assert runtime.peak_bytes - stored.peak_bytes >= 2 * copy_bytes
    walked = setups.walk_setup(model, infer_shapes(model), (), list(range(len(model.graph.node))), "cpu")
    step = {label: k for k, label in enumerate(walked.labels)}
    matmuls = [step[f"MatMul#{2 * i}"] for i in range(4)]
    for i in range(4):  # each weight's Cast after the MatMul before its own
        assert (matmuls[i - 1] if i else -1) < step[CAST_PREFIX + f"w{i}"] < matmuls[i]


def _chain_behind_a_computed_reshape(d: int, declared: bool) -> onnx.ModelProto:
    """x [batch, sequence, d] float16 reshaped to a shape computed from Shape(x) (onnxruntime's
    inference: [?, ?, d]), then Relu, Neg, an MLP and a residual Add, all run in float32. With
    `declared`, the model declares the Relu's float16 output [batch, sequence, d]: a name
    inference cannot derive, on a tensor the graph onnxruntime runs no longer has (the Casts
    around it cancel)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["leading"]),
        helper.make_node("Concat", ["leading", "width"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("MatMul", ["b", "up"], ["c"]),
        helper.make_node("Relu", ["c"], ["g"]),
        helper.make_node("MatMul", ["g", "down"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["out"]),
    ]
    model = _model(nodes, [_io("x", F16, ["batch", "sequence", d])], [_io("out", F16)],
                   [_weight("up", [d, 4 * d], 1), _weight("down", [4 * d, d], 2), _ints("zero", [0]),
                    _ints("two", [2]), _ints("width", [d])])
    if declared:
        model.graph.value_info.append(_io("a", F16, ["batch", "sequence", d]))
    return model


def _runtime_node_arg_shapes(model: onnx.ModelProto, folder) -> dict[str, tuple | None]:
    """Each tensor's shape as onnxruntime's CPU provider holds it after inserting its Casts (graph
    optimization disabled): its NodeArgs, read from the session saved in the ORT format (an ONNX
    save writes no value_info for them). A dim it cannot name is None."""
    import onnxruntime as ort
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py import fbs

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(folder / "saved.ort")
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    with open(options.optimized_model_filepath, "rb") as saved:
        graph = fbs.InferenceSession.InferenceSession.GetRootAsInferenceSession(saved.read(), 0).Model().Graph()
    param, value = fbs.DimensionValueType.DimensionValueType.PARAM, fbs.DimensionValueType.DimensionValueType.VALUE
    shapes = {}
    for i in range(graph.NodeArgsLength()):
        arg = graph.NodeArgs(i)
        tensor = fbs.TensorTypeAndShape.TensorTypeAndShape()
        tensor.Init(arg.Type().Value().Bytes, arg.Type().Value().Pos)
        shape = tensor.Shape()
        dims = None if shape is None else [shape.Dim(k).Value() for k in range(shape.DimLength())]
        shapes[arg.Name().decode()] = None if dims is None else tuple(
            d.DimParam().decode() if d is not None and d.DimType() == param
            else d.DimValue() if d is not None and d.DimType() == value else None for d in dims)
    return shapes


def test_a_float32_chain_keeps_the_dims_its_float16_tensors_declared(tmp_path):
    """onnxruntime shapes the float32 copies on the graph with every inserted Cast still there,
    where the Neg reads the Cast of the declared float16 `a`, and keeps those dims once the Casts
    that cancel are gone (the Neg then reads the Relu's float32 output, [?, ?, d] by inference)."""
    d = 16
    model = _chain_behind_a_computed_reshape(d, declared=True)
    graph = setups.walk_setup(model, infer_shapes(model), (), None, "cpu").graph
    runtime = _runtime_node_arg_shapes(model, tmp_path)
    assert graph.float_copies  # the chain runs in float32
    for copy in graph.float_copies:
        assert graph.planner_shapes[copy].shape == runtime[copy], copy
    assert graph.planner_shapes[CAST_PREFIX + "b"].shape == ("batch", "sequence", d)
    assert graph.planner_shapes[CAST_PREFIX + "a"].shape == (None, None, None)


@pytest.mark.parametrize(("declared", "mib"), [
    # the MLP's Relu runs in place over c (onnxruntime writes in place only where it knows both
    # shapes equal): at the second MatMul g 16 MiB, b and h 4 each, x 2, the float32 copy of
    # `down` 1 = 27
    (True, 27),
    # nothing names the chain's dims: the Relu writes a buffer of its own, c and g 16 MiB each
    (False, 39),
])
def test_the_estimate_shares_the_buffers_declared_dims_let_onnxruntime_share(declared, mib):
    """Inferred on the graph onnxruntime runs alone, the copies of the declared chain were
    [?, ?, ?] and the estimate 39 MiB, the undeclared graph's, against 27 allocated."""
    model = _chain_behind_a_computed_reshape(256, declared)
    dims = {"batch": 8, "sequence": 512}
    estimate = profile_memory(model, infer_shapes(model, dims=dims)).peak_bytes
    assert estimate == mib * MIB
    measured = measure_peak(model, dims=dims, repeats=1)
    if measured.allocated_bytes is None:
        pytest.skip(f"cannot count allocations here: {measured.allocated_reason or measured.reason}")
    assert abs(estimate - measured.allocated_bytes) <= 0.02 * measured.allocated_bytes, (estimate, measured)
