"""Models with If/Loop bodies are written loadable and equal in meaning: weights of the main graph
read only inside a branch stay in the main graph, once; a body's own weights keep the storage the
input gave them (embedded, or external data relative to the output's folder); a match inside a body
never takes a node of the enclosing graph; and a model in which nothing fires round-trips."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.verify import make_session
from tests.conftest import optimize_model
from tests.graphs import IR_VERSION

RNG = np.random.default_rng(7)
BIG = 160  # a 160 x 160 float weight is 100 KiB: above the size fuse holds by reference


def _value(name: str, shape=None, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def _weight(name: str, n: int = BIG) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal((n, n)).astype(np.float32) / n, name)


def _branch(name: str, nodes, out: str, initializers=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_value(out)], list(initializers))


def outer_weight_in_both_branches() -> onnx.ModelProto:
    """An If whose two branches read one weight of the main graph, as optimum's merged decoders
    do; no main node reads it. The then branch also holds an Add of zero, which fuse removes."""
    then = _branch("then", [helper.make_node("MatMul", ["x", "W"], ["t0"], name="then_mm"),
                            helper.make_node("Add", ["t0", "zero"], ["t"], name="then_add")], "t",
                   [numpy_helper.from_array(np.zeros(BIG, np.float32), "zero")])
    other = _branch("else", [helper.make_node("MatMul", ["x", "W"], ["e0"], name="else_mm"),
                             helper.make_node("Relu", ["e0"], ["e"], name="else_relu")], "e")
    return _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                  [_value("x", ["n", BIG]), _value("c", [], TensorProto.BOOL)], [_value("y", ["n", BIG])],
                  [_weight("W")])


def own_weights_in_each_branch() -> onnx.ModelProto:
    """Each branch holds its own big weight (an LSTM's, in torch 2.3 exports)."""
    then = _branch("then", [helper.make_node("MatMul", ["x", "Wt"], ["t"], name="then_mm")], "t", [_weight("Wt")])
    other = _branch("else", [helper.make_node("MatMul", ["x", "We"], ["e"], name="else_mm")], "e", [_weight("We")])
    return _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                  [_value("x", ["n", BIG]), _value("c", [], TensorProto.BOOL)], [_value("y", ["n", BIG])])


def loop_reading_outer_weight() -> onnx.ModelProto:
    """A Loop whose body multiplies the carried value by a weight of the main graph, and holds an
    If whose branch reads it too (a body inside a body)."""
    inner = _branch("inner_then", [helper.make_node("Mul", ["v_in", "scale"], ["s"], name="inner_mul")], "s")
    inner_else = _branch("inner_else", [helper.make_node("Identity", ["v_in"], ["s2"], name="inner_id")], "s2")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         helper.make_node("If", ["c"], ["picked"], name="inner_if", then_branch=inner, else_branch=inner_else),
         helper.make_node("MatMul", ["picked", "W"], ["v_out"], name="body_mm")],
        "body",
        [_value("i", [], TensorProto.INT64), _value("cond_in", [], TensorProto.BOOL), _value("v_in", ["n", BIG])],
        [_value("cond_out", [], TensorProto.BOOL), _value("v_out", ["n", BIG])])
    trips = numpy_helper.from_array(np.array(3, np.int64), "trips")
    return _model([helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)],
                  [_value("x", ["n", BIG]), _value("c", [], TensorProto.BOOL)], [_value("y", ["n", BIG])],
                  [_weight("W"), trips, numpy_helper.from_array(np.full(BIG, 0.5, np.float32), "scale")])


MODELS = {"outer-weight": outer_weight_in_both_branches, "own-weights": own_weights_in_each_branch,
          "loop": loop_reading_outer_weight}


def _outputs(model_or_path, cond: bool, n: int = 3) -> list[np.ndarray]:
    feeds = {"x": np.random.default_rng(n).standard_normal((n, BIG)).astype(np.float32), "c": np.array(cond)}
    session = make_session(model_or_path)
    return session.run(None, {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})


def _initializers(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """Initializer names per graph, bodies keyed by their node and attribute."""
    found = {"main": [t.name for t in graph.initializer]}
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                for key, names in _initializers(attr.g).items():
                    found[f"{node.name}.{attr.name}" + ("" if key == "main" else f"/{key}")] = names
    return found


def _external_locations(graph: onnx.GraphProto) -> list[str]:
    locations = [e.value for t in graph.initializer for e in t.external_data if e.key == "location"]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                locations += _external_locations(attr.g)
    return locations


@pytest.mark.parametrize("external", [False, True], ids=["embedded", "external-data"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_written_model_loads_and_matches(name, external, tmp_path):
    model = MODELS[name]()
    source = tmp_path / "model.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx.save moves the weights of the model it is given to external data
    onnx.save(saved, source, save_as_external_data=external, all_tensors_to_one_file=True, location="model.data",
              size_threshold=1024)
    from fuse_cli import api
    from fuse_cli.config import FuseConfig
    result = api.optimize(source, FuseConfig(), tmp_path / "out.onnx")
    assert result.report.verification.status == "match", result.report.verification
    written = onnx.load(tmp_path / "out.onnx", load_external_data=False)
    locations = _external_locations(written.graph)
    assert bool(locations) == external
    assert all(not os.path.isabs(loc) and (tmp_path / loc).is_file() for loc in locations), locations
    for cond in (True, False):
        for want, got in zip(_outputs(model, cond), _outputs(str(tmp_path / "out.onnx"), cond)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_outer_weight_stays_in_the_main_graph_once(tmp_path):
    result = optimize_model(outer_weight_in_both_branches(), tmp_path)
    assert _initializers(result.model.graph) == {"main": ["W"], "if.then_branch": [], "if.else_branch": []}
    assert [f.pass_name for f in result.report.fusions] == ["eliminate-noop-arith"]


def test_own_branch_weights_stay_in_their_branch(tmp_path):
    result = optimize_model(own_weights_in_each_branch(), tmp_path)
    assert _initializers(result.model.graph) == {"main": [], "if.then_branch": ["Wt"], "if.else_branch": ["We"]}


def test_nested_bodies_read_the_main_graph_weight(tmp_path):
    result = optimize_model(loop_reading_outer_weight(), tmp_path)
    found = _initializers(result.model.graph)
    assert set(found.pop("main")) == {"W", "trips", "scale"}
    assert not any(found.values()), found


def test_a_body_pattern_never_takes_an_outer_node(tmp_path):
    """Conv in the main graph, its BatchNormalization inside a branch: conv-bn would move the
    main graph's Conv into the branch. It must not fire, and says why."""
    channels = 4
    bn_inputs = [numpy_helper.from_array(RNG.uniform(0.5, 1.5, channels).astype(np.float32), name)
                 for name in ("gamma", "beta", "mean", "var")]
    then = _branch("then", [helper.make_node("BatchNormalization", ["conv", "gamma", "beta", "mean", "var"], ["t"],
                                             name="then_bn")], "t")
    other = _branch("else", [helper.make_node("Relu", ["conv"], ["e"], name="else_relu")], "e")
    weight = numpy_helper.from_array(RNG.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
                    helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                   [_value("x", [1, 3, 8, 8]), _value("c", [], TensorProto.BOOL)], [_value("y", [1, channels, 8, 8])],
                   [weight, *bn_inputs])
    result = optimize_model(model, tmp_path, passes=("conv-bn",))
    assert not result.report.fusions
    reasons = [m.reason for m in result.report.near_misses if m.pass_name == "conv-bn"]
    assert reasons == ["conv belongs to the graph enclosing this subgraph"]
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    for cond in (True, False):
        want = make_session(model).run(None, {"x": x, "c": np.array(cond)})
        got = make_session(result.model).run(None, {"x": x, "c": np.array(cond)})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_round_trip_with_nothing_fired(name, tmp_path):
    """A pass that finds nothing: the output is the input in meaning, and loads."""
    model = MODELS[name]()
    result = optimize_model(model, tmp_path, passes=("fuse-casts",))
    assert not result.report.fusions
    for cond in (True, False):
        for want, got in zip(_outputs(model, cond), _outputs(result.model, cond)):
            np.testing.assert_array_equal(got, want)


def _if_on(cond_input: str, extra_inputs=(), initializers=()) -> onnx.ModelProto:
    """y = If(cond) then MatMul(x, W) + zero, else Relu(x); the then branch reads W of the main graph."""
    branches = {a.name: a.g for a in outer_weight_in_both_branches().graph.node[0].attribute}
    return _model([helper.make_node("If", [cond_input], ["y"], name="if", then_branch=branches["then_branch"],
                                    else_branch=_branch("else", [helper.make_node("Relu", ["x"], ["e"])], "e"))],
                  [_value("x", ["n", BIG]), *extra_inputs], [_value("y", ["n", BIG])], [_weight("W"), *initializers])


@pytest.mark.parametrize("cond", [True, False])
def test_an_if_on_a_constant_becomes_its_branch(cond, tmp_path):
    """The taken branch stands in the If's place, where its Add of zero goes as in any graph."""
    model = _if_on("c", initializers=[numpy_helper.from_array(np.array(cond), "c")])
    result = optimize_model(model, tmp_path)
    assert [n.op_type for n in result.model.graph.node] == (["MatMul"] if cond else ["Relu"])
    assert "inline-constant-if" in {f.pass_name for f in result.report.fusions}
    x = np.random.default_rng(0).standard_normal((5, BIG)).astype(np.float32)
    want = make_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(make_session(result.model).run(None, {"x": x})[0], want, rtol=1e-6)


def test_an_if_on_an_input_stays(tmp_path):
    model = _if_on("c", extra_inputs=[_value("c", [], TensorProto.BOOL)])
    result = optimize_model(model, tmp_path, passes=("inline-constant-if",))
    assert not result.report.fusions
    assert [m.reason for m in result.report.near_misses] == ["if's condition 'c' is computed at run time"]


def test_every_output_of_an_inlined_if_is_made(tmp_path):
    """Two outputs, each read by its own node (a VAD's decoder: graphsurgeon's own inlining left
    the second reader reading nothing)."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
                             "then", [], [_value("a"), _value("b")])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["c"]), helper.make_node("Sigmoid", ["x"], ["d"])],
                              "else", [], [_value("c"), _value("d")])
    model = _model([helper.make_node("Equal", ["k", "k"], ["cond"], name="same"),
                    helper.make_node("If", ["cond"], ["y0", "y1"], name="if", then_branch=then, else_branch=other),
                    helper.make_node("Exp", ["y0"], ["out0"], name="exp"),
                    helper.make_node("Tanh", ["y1"], ["out1"], name="tanh")],
                   [_value("x", ["n", 4])], [_value("out0", ["n", 4]), _value("out1", ["n", 4])],
                   [numpy_helper.from_array(np.array(2, np.int64), "k")])
    result = optimize_model(model, tmp_path)
    assert sorted(n.op_type for n in result.model.graph.node) == ["Exp", "Neg", "Relu", "Tanh"]
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for want, got in zip(make_session(model).run(None, {"x": x}), make_session(result.model).run(None, {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_constants_fold_inside_a_branch(tmp_path):
    """A branch slicing a main-graph weight (an LSTM's gates, as torch writes them in a VAD's
    decoder): the slice is a constant, computed once. graphsurgeon's folder runs a body as a
    model of its own, at the model's IR version (its own default, IR 14, onnxruntime 1.31 refuses)."""
    bounds = [numpy_helper.from_array(np.array([v], np.int64), n) for v, n in ((0, "starts"), (BIG // 2, "ends"),
                                                                               (1, "axes"))]
    then = _branch("then", [helper.make_node("Slice", ["W", "starts", "ends", "axes"], ["w_half"], name="then_slice"),
                            helper.make_node("MatMul", ["x", "w_half"], ["t"], name="then_mm")], "t")
    other = _branch("else", [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["e"], name="else_slice")],
                    "e")
    model = _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                   [_value("x", ["n", BIG]), _value("c", [], TensorProto.BOOL)], [_value("y", ["n", BIG // 2])],
                   [_weight("W"), *bounds], opset=17)
    result = optimize_model(model, tmp_path)
    branches = {a.name: a.g for a in result.model.graph.node[0].attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["MatMul"]
    assert [n.op_type for n in branches["else_branch"].node] == ["Slice"]
    for cond in (True, False):
        for want, got in zip(_outputs(model, cond), _outputs(result.model, cond)):
            np.testing.assert_array_equal(got, want)



def test_a_branch_still_computes_what_it_returns(tmp_path):
    """A branch returning Identity(W), W a weight of the main graph (T5's merged decoder returns
    its cross-attention cache so): folded, the branch would return a weight, which onnxruntime
    refuses; an Identity computes it again."""
    then = _branch("then", [helper.make_node("Identity", ["W"], ["kept"], name="then_id")], "kept")
    other = _branch("else", [helper.make_node("Relu", ["W"], ["e"], name="else_relu")], "e")
    model = _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                   [_value("c", [], TensorProto.BOOL)], [_value("y", [BIG, BIG])], [_weight("W")])
    result = optimize_model(model, tmp_path)
    branches = {a.name: a.g for a in result.model.graph.node[0].attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Identity"]
    for cond in (True, False):
        want = make_session(model).run(None, {"c": np.array(cond)})[0]
        np.testing.assert_array_equal(make_session(result.model).run(None, {"c": np.array(cond)})[0], want)
