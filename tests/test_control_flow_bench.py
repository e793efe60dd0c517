"""benchmarks/control_flow_bench.py's pure helpers: node counting through If branches and Loop
bodies on a model built here, the CLI arguments of a binding, and the tables from made-up rows.
No corpus is needed and no timing is asserted."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tests.conftest import benchmark_script
from tests.graphs import IR_VERSION

control_flow_bench = benchmark_script("control_flow_bench")


def nested_model() -> onnx.ModelProto:
    """y = If(sum(x) > 0, then: Loop 3 times (acc = acc * w + 1), else: x - 1) + 1: 3 outer nodes,
    the then-branch 1 (the Loop) + its body 3, the else-branch 1: 8 in all. The Loop's body reads
    the outer initializer w."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_in", "w"], ["scaled"]),
         helper.make_node("Add", ["scaled", "one"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", f, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", f, [2])])
    then_branch = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["looped"], body=body)], "then", [],
        [helper.make_tensor_value_info("looped", f, [2])])
    else_branch = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["lowered"])], "else", [],
        [helper.make_tensor_value_info("lowered", f, [2])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["chosen"], then_branch=then_branch, else_branch=else_branch),
         helper.make_node("Add", ["chosen", "one"], ["y"])],
        "nested", [helper.make_tensor_value_info("x", f, [2])], [helper.make_tensor_value_info("y", f, [2])],
        [helper.make_tensor("w", f, [2], [2.0, 3.0]), helper.make_tensor("one", f, [], [1.0]),
         helper.make_tensor("zero", f, [], [0.0]), helper.make_tensor("trips", TensorProto.INT64, [], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_the_nested_model_is_what_its_docstring_says():
    session = ort.InferenceSession(nested_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([1.0, 2.0], np.float32)
    acc = x.copy()
    for _ in range(3):
        acc = acc * np.array([2.0, 3.0], np.float32) + 1
    np.testing.assert_allclose(session.run(None, {"x": x})[0], acc + 1)
    np.testing.assert_allclose(session.run(None, {"x": -x})[0], -x - 1 + 1)


def test_nodes_are_counted_through_branches_and_bodies():
    graph = nested_model().graph
    assert len(graph.node) == 4
    assert control_flow_bench.count_nodes(graph) == 4 + 1 + 3 + 1
    counts = control_flow_bench.op_counts(graph)
    assert (counts["If"], counts["Loop"], counts["Add"], counts["Identity"]) == (1, 1, 2, 1)
    assert control_flow_bench.control_flow_text(graph) == "If 1, Loop 1"


def test_a_graph_without_control_flow_says_none():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "flat",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    assert control_flow_bench.count_nodes(graph) == 1
    assert control_flow_bench.control_flow_text(graph) == "none"


def test_a_binding_becomes_fuses_options():
    binding = {"dims": {"batch": 1, "sequence": 512}, "input_shapes": {"state": [2, 1, 128]},
               "int_ranges": {"sr": [16000, 16001]}}
    assert control_flow_bench.binding_args(binding) == [
        "--dim", "batch=1", "--dim", "sequence=512", "--input-shape", "state:2x1x128", "--int-range", "sr=16000:16001"]


def made_up_row() -> "control_flow_bench.ModelRow":
    bench = control_flow_bench
    model = bench.ModelRow("vad", "If 25", 689, 5, {"dims": {"batch": 1}}, cpu_ms={"disabled": 2.0, "all": 1.5})
    model.tools = [
        bench.ToolRow("fuse-onnx", nodes=686, error="exit 1, left a file", load_error="INVALID_GRAPH | sorted",
                      exit_code=1, verification="mismatch", seconds=12.25),
        bench.ToolRow("fuse-ort-cpu", error="ran past 600 s", exit_code=None),
        bench.ToolRow("onnxslim", nodes=152, seconds=1.0, max_abs_diff=2e-7,
                      cpu_ratio={"disabled": 0.67, "all": 0.9}),
    ]
    model.memory = bench.Memory(exit_code=0, estimate_before=3 << 20, measured_before=4 << 20,
                                estimate_after=1536, measured_after=None)
    return model


def test_each_failure_is_a_cell_and_the_tables_render():
    text = control_flow_bench.markdown({"created": "now", "seconds": 1.0, "versions": {"fuse-cli": "0"},
                                        "machine": {"platform": "p", "onnx": "1", "onnxruntime": "2"},
                                        "notes": ["a note"]}, [made_up_row()])
    assert ("| vad | If 25 | 689 (5 top) | 686, does not load | failed: ran past 600 s | 152 | not run | not run "
            "| no / no rival |" in text)
    assert "| vad | onnx | 1 | mismatch | 12.2 | - | exit 1, left a file; output: INVALID_GRAPH \\| sorted |" in text
    assert "| vad | ort-cpu | - | - | - | - | ran past 600 s |" in text
    assert "| vad | original (ms) | 2.000 / 1.500 |  |" in text
    assert "| vad | fuse-onnx | - | does not load or run |" in text
    assert "| vad | fuse-ort-cpu | - | no output |" in text
    assert "| vad | onnxslim | 0.67 / 0.90 |  |" in text
    assert "| vad | 3.00 MiB | 4.00 MiB | 0.75 | 1.5 KiB | - |  |" in text
    assert "- a note" in text and '- vad: {"dims": {"batch": 1}}' in text


def test_the_node_goal_counts_only_outputs_that_load():
    model = made_up_row()
    fuse = model.tool("fuse-onnx")
    fuse.nodes = 100
    assert control_flow_bench.node_goal(model, "fuse-onnx", ("onnxslim", "onnxsim")) == "no"
    fuse.load_error = None
    assert control_flow_bench.node_goal(model, "fuse-onnx", ("onnxslim", "onnxsim")) == "no"  # exit 1
    assert control_flow_bench.node_cell(fuse) == "100, exit 1"
    fuse.error, fuse.exit_code = None, 0
    assert control_flow_bench.node_goal(model, "fuse-onnx", ("onnxslim", "onnxsim")) == "yes"
    fuse.nodes = 153
    assert control_flow_bench.node_goal(model, "fuse-onnx", ("onnxslim", "onnxsim")) == "no"  # onnxslim: 152
    model.tool("onnxslim").load_error = "INVALID_GRAPH"
    assert control_flow_bench.node_goal(model, "fuse-onnx", ("onnxslim", "onnxsim")) == "no rival"


def test_a_report_that_failed_fills_the_memory_row_with_why():
    model = made_up_row()
    model.memory = control_flow_bench.Memory(exit_code=2, error="fuse: error: onnxruntime cannot run the model")
    assert control_flow_bench.memory_rows([model]) == [
        ["vad", "-", "-", "-", "-", "-", "exit 2: fuse: error: onnxruntime cannot run the model"]]


def test_fuse_failing_on_bad_input_is_a_cell_not_a_crash(tmp_path):
    not_a_model = tmp_path / "broken.onnx"
    not_a_model.write_bytes(b"not a protobuf")
    row = control_flow_bench.run_fuse(not_a_model, "onnx", tmp_path / "out.onnx", {"dims": {"batch": 1}}, timeout=120)
    assert row.exit_code == 2
    assert row.verification is None and row.nodes is None
    assert "broken.onnx" in row.error
    assert not (tmp_path / "out.onnx").exists()
