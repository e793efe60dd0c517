"""The memory of control-flow bodies: what an If, Loop or Scan adds at its step of the liveness walk.

onnxruntime runs a body as a graph of its own (a subgraph session state, planned by the same
allocation planner, with the same arena and memory-pattern settings), so a body's cost is its own
liveness walk (`memory.profile_memory` on the body as a model), at its shapes at the bound dims.
What the outer walk already counts is left out of it: the values the body reads from the
enclosing scope (they are alive in the outer walk until the node runs) and the node's inputs and
outputs. The kernels, read in onnxruntime's source (core/providers/cpu/controlflow):
- If (if.cc) runs one branch and hands it the If's outputs as its fetches: a branch output is
  written into the If's output buffer, not copied. The branch that runs is counted: the taken one
  where the condition is a constant, else the one with the larger peak. Its peak, outputs
  included, replaces the If's outputs at the step (scratch = branch peak - the If's outputs).
- Loop (loop.cc) feeds iteration i the loop-carried values iteration i-1 fetched (the Loop's own
  inputs at i = 0), keeps each iteration's scan outputs, then copies the last carried values into
  its outputs and concatenates the scan outputs into theirs. At the last iteration: carried values
  C (from the iteration before) + the body's peak P (its fetches included) + N-1 scan pieces; at
  the end, the feeds and fetches of the last iteration (2 C) + N pieces beside the Loop's outputs
  (measured: an accumulating Loop was C short without the feeds). Scratch = max(C + P + (N-1) s -
  outputs, 2 C + N s).
- Scan (scan_9.cc, scan_utils.cc) writes each iteration's scan outputs into slices of its output
  (allocated up front) and reads scan inputs as slices of its inputs (no copy along axis 0). A
  state variable lives in two buffers of its own when the sequence is longer than 1 (a) and 2 (b),
  the first iteration reading the Scan's input and the last writing its output. Scratch = the
  body's peak with its outputs left out + those buffers (+ a transposed copy of each scan input
  or output on an axis other than 0).
Shapes inside a body: onnx's inference writes a body's value_info with the body's own declared
symbols, not the outer graph's bound dims, so each body is inferred again as a model of its own,
its inputs and outer-scope values declared at the outer shapes (bound for the sizes, symbolic for
onnxruntime's planner, which compares shapes before any dim is bound).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, infer_shapes
from fuse_cli.core.order import consumed_names

# (domain, op_type) of the nodes whose bodies are counted
CONTROL_FLOW_OPS = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})
# A constant read as an If condition or a Loop trip count is a scalar: bigger ones are not read.
_SMALL_CONSTANT = 8
_CACHE_KEPT = 64


@dataclass(frozen=True)
class BodyCost:
    """What one control-flow node's body adds at its step (`scratch_bytes`), and the sizes of its
    outputs that the outer shape table left unknown and the body gives (`output_bytes`).
    `counted`: the branch or body counted; `reason`: why that one ("larger", "constant true",
    "one iteration of N"); `body_peak`: its own peak; `unknown`: body tensors of unknown size."""

    node: str
    op_type: str
    counted: str
    reason: str
    body_peak: int
    scratch_bytes: int
    iterations: int | None = None
    output_bytes: Mapping[str, int] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    other_peak: int | None = None  # the If branch not counted: its peak


def constant_values(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto]) -> dict[str, np.ndarray]:
    """The values of the If conditions and Loop trip counts and conditions of `nodes` that are
    small constants of `graph` (initializers or Constant outputs)."""
    wanted = set()
    for node in nodes:
        if node.op_type == "If":
            wanted.update(node.input[:1])
        elif node.op_type == "Loop":
            wanted.update(node.input[:2])
    wanted.discard("")
    values: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        if tensor.name in wanted and math.prod(tensor.dims) <= _SMALL_CONSTANT and tensor.data_location != TensorProto.EXTERNAL:
            values[tensor.name] = numpy_helper.to_array(tensor)
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in wanted:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and math.prod(value.dims) <= _SMALL_CONSTANT:
                values[node.output[0]] = numpy_helper.to_array(value)
    return values


def body_cost(node: onnx.NodeProto, label: str, shapes: ShapeTable, planner: Mapping[str, TensorInfo],
              opset: int, constants: Mapping[str, np.ndarray]) -> BodyCost | None:
    """The cost of `node`'s body at `shapes` (the outer graph's sizes; `planner`: its shapes as
    onnxruntime's planner sees them); None for a node that is not an If, Loop or Scan, or whose
    body cannot be read."""
    key = _cache_key(node, shapes, planner, opset, constants)
    if key in _CACHE:
        cost = _CACHE[key]
        return None if cost is None else BodyCost(label, *_fields_after_label(cost))
    cost = _compute(node, label, shapes, planner, opset, constants)
    if len(_CACHE) >= _CACHE_KEPT:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = cost
    return cost


# By the node's bytes and everything the cost reads of the outer graph: a candidate model keeps
# most control-flow nodes as they were, and the peak guard walks each candidate.
_CACHE: dict[tuple, BodyCost | None] = {}


def _fields_after_label(cost: BodyCost) -> tuple:
    return (cost.op_type, cost.counted, cost.reason, cost.body_peak, cost.scratch_bytes, cost.iterations,
            cost.output_bytes, cost.unknown, cost.other_peak)


def _cache_key(node: onnx.NodeProto, shapes: ShapeTable, planner: Mapping[str, TensorInfo], opset: int,
               constants: Mapping[str, np.ndarray]) -> tuple:
    names = sorted(consumed_names(node) | set(node.output))
    infos = tuple((shapes.get(name), planner.get(name)) for name in names)
    values = tuple((name, constants[name].tobytes()) for name in names if name in constants)
    return node.SerializeToString(), opset, infos, values


def _compute(node: onnx.NodeProto, label: str, shapes: ShapeTable, planner: Mapping[str, TensorInfo],
             opset: int, constants: Mapping[str, np.ndarray]) -> BodyCost | None:
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if node.op_type == "If" and {"then_branch", "else_branch"} <= graphs.keys():
        return _if_cost(node, label, graphs, shapes, planner, opset, constants)
    if node.op_type == "Loop" and "body" in graphs:
        return _loop_cost(node, label, graphs["body"], shapes, planner, opset, constants)
    if node.op_type == "Scan" and "body" in graphs:
        return _scan_cost(node, label, graphs["body"], shapes, planner, opset)
    return None


def _outputs_known(node: onnx.NodeProto, shapes: ShapeTable) -> dict[str, int]:
    return {name: size for name in node.output if name and (size := shapes.nbytes(name)) is not None}


def _if_cost(node, label, graphs, shapes, planner, opset, constants) -> BodyCost:
    walks = {name: _Body(graphs[name], [], shapes, planner, opset) for name in ("then_branch", "else_branch")}
    peaks = {name: walk.profile().peak_bytes for name, walk in walks.items()}
    condition = constants.get(node.input[0]) if node.input else None
    if condition is not None and condition.size == 1:
        counted, reason = ("then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"), \
            f"the condition is a constant {'true' if bool(condition.reshape(-1)[0]) else 'false'}"
    else:
        counted = max(peaks, key=lambda name: (peaks[name], name == "then_branch"))
        reason = "larger"
    walk = walks[counted]
    filled = {name: size for name, body_name in zip(node.output, (o.name for o in graphs[counted].output))
              if name and shapes.nbytes(name) is None and (size := walk.table.nbytes(body_name)) is not None}
    outputs = sum(_outputs_known(node, shapes).values()) + sum(filled.values())
    other = next(name for name in peaks if name != counted)
    return BodyCost(label, "If", counted, reason, peaks[counted], max(0, peaks[counted] - outputs),
                    output_bytes=filled, unknown=walk.profile().unknown_tensors,
                    other_peak=peaks[other])


def _loop_cost(node, label, body, shapes, planner, opset, constants) -> BodyCost:
    carried_names = [name for name in node.input[2:]]
    declared = list(body.input)
    inputs = [(declared[0], TensorInfo("", TensorProto.INT64, ()), TensorInfo("", TensorProto.INT64, ())),
              (declared[1], TensorInfo("", TensorProto.BOOL, ()), TensorInfo("", TensorProto.BOOL, ()))]
    inputs += [(vi, shapes.get(name), planner.get(name)) for vi, name in zip(declared[2:], carried_names)]
    walk = _Body(body, inputs, shapes, planner, opset)
    profile = walk.profile(feeds_counted=False)
    carried = len(carried_names)
    body_outputs = [o.name for o in body.output]
    carried_bytes = sum(walk.table.nbytes(vi.name) or 0 for vi in declared[2:])
    piece = sum(walk.table.nbytes(name) or 0 for name in body_outputs[1 + carried:])
    trip = constants.get(node.input[0]) if node.input and node.input[0] else None
    iterations = int(trip.reshape(-1)[0]) if trip is not None and trip.size == 1 else None
    scan_outputs = node.output[carried:]
    if iterations is None:  # the trip count from a scan output's length, where the table knows it
        lengths = {info.shape[0] for name in scan_outputs if (info := shapes.get(name)) is not None
                   and info.shape and isinstance(info.shape[0], int)}
        iterations = lengths.pop() if len(lengths) == 1 else None
    filled: dict[str, int] = {}
    for name, body_name in zip(node.output, body_outputs[1:]):
        size = walk.table.nbytes(body_name)
        if name and shapes.nbytes(name) is None and size is not None:
            if name in scan_outputs:
                if iterations is None:
                    continue
                size *= iterations
            filled[name] = size
    outputs = sum(_outputs_known(node, shapes).values()) + sum(filled.values())
    n = iterations if iterations is not None else 2  # unknown: a carried value from an iteration before
    last_iteration = (carried_bytes if n > 1 else 0) + profile.peak_bytes + max(n - 1, 0) * piece
    # at the end the last two iterations' carried values are both held (feeds and fetches)
    end = (carried_bytes if n > 1 else 0) + carried_bytes + n * piece if n else 0
    return BodyCost(label, "Loop", "body", "one iteration", profile.peak_bytes,
                    max(last_iteration - outputs, end, 0), iterations, filled, profile.unknown_tensors)


def _scan_cost(node, label, body, shapes, planner, opset) -> BodyCost:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    scans = int(attrs.get("num_scan_inputs", 0))
    declared = list(body.input)
    states = len(declared) - scans
    input_axes = list(attrs.get("scan_input_axes") or [0] * scans)
    output_axes = list(attrs.get("scan_output_axes") or [0] * (len(body.output) - states))
    inputs, length = [], None
    for index, (vi, name) in enumerate(zip(declared, node.input)):
        info, symbolic = shapes.get(name), planner.get(name)
        if index >= states:
            axis = input_axes[index - states]
            info, symbolic = _without_axis(info, axis), _without_axis(symbolic, axis)
            outer = shapes.get(name)
            if outer is not None and outer.shape is not None and isinstance(outer.shape[axis % len(outer.shape)], int):
                length = outer.shape[axis % len(outer.shape)]
        inputs.append((vi, info, symbolic))
    walk = _Body(body, inputs, shapes, planner, opset)
    profile = walk.profile(feeds_counted=False, fetches_counted=False)
    state_bytes = sum(walk.table.nbytes(vi.name) or 0 for vi in declared[:states])
    n = length if length is not None else 3
    buffers = state_bytes * ((n > 1) + (n > 2))
    transposed = sum(shapes.nbytes(name) or 0 for name, axis in zip(node.input[states:], input_axes) if axis % max(
        len((shapes.get(name) or TensorInfo("", 0, ())).shape or ()), 1))
    transposed += sum(shapes.nbytes(name) or 0 for name, axis in zip(node.output[states:], output_axes) if axis)
    filled: dict[str, int] = {}
    for index, (name, body_out) in enumerate(zip(node.output, body.output)):
        size = walk.table.nbytes(body_out.name)
        if name and shapes.nbytes(name) is None and size is not None and (index < states or length is not None):
            filled[name] = size if index < states else size * length
    return BodyCost(label, "Scan", "body", "one iteration", profile.peak_bytes,
                    profile.peak_bytes + buffers + transposed, length, filled, profile.unknown_tensors)


def _without_axis(info: TensorInfo | None, axis: int) -> TensorInfo | None:
    if info is None or info.shape is None or not info.shape:
        return None
    shape = list(info.shape)
    del shape[axis % len(shape)]
    return TensorInfo(info.name, info.elem_type, tuple(shape))


class _Body:
    """One body as a model of its own: its inputs (and the outer-scope values it reads) declared at
    the outer shapes, inferred at the bound ones (`table`) and the symbolic ones (the planner's)."""

    def __init__(self, graph: onnx.GraphProto, inputs: Sequence[tuple], shapes: ShapeTable,
                 planner: Mapping[str, TensorInfo], opset: int):
        self.feeds = [vi.name for vi, _, _ in inputs]
        self.outer = sorted(outer_references(graph))
        self.outputs = [o.name for o in graph.output]
        bound = [_value_info(vi.name, info, vi) for vi, info, _ in inputs]
        symbolic = [_value_info(vi.name, info, vi) for vi, _, info in inputs]
        bound += [_value_info(name, shapes.get(name)) for name in self.outer]
        symbolic += [_value_info(name, planner.get(name)) for name in self.outer]
        self.model = _as_model(graph, [vi for vi in bound if vi is not None], opset, declared=False)
        self.symbolic_model = _as_model(graph, [vi for vi in symbolic if vi is not None], opset, declared=True)
        self.table = infer_shapes(self.model)
        self._profiles: dict[tuple[bool, bool], object] = {}

    def profile(self, feeds_counted: bool = True, fetches_counted: bool = True):
        """The body's liveness walk. Outer-scope values, and its inputs unless `feeds_counted`,
        are weights to it: counted by the walk outside or by the kernel's rule. Its outputs are
        left out unless `fetches_counted` (Scan writes them into buffers counted apart)."""
        from fuse_cli.analysis.memory import profile_memory  # memory.py calls this module

        key = (feeds_counted, fetches_counted)
        if key not in self._profiles:
            weights = set(self.outer) | (set() if feeds_counted else set(self.feeds))
            absent = () if fetches_counted else self.outputs
            self._profiles[key] = profile_memory(self.model, self.table, extra_weights=weights, absent=absent,
                                                 symbolic_shapes=infer_shapes(self.symbolic_model))
        return self._profiles[key]


def outer_references(graph: onnx.GraphProto) -> set[str]:
    """Names `graph` (nested graphs included) reads and does not define: ONNX forbids shadowing."""
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    used = {vi.name for vi in graph.output}
    for node in graph.node:
        defined.update(node.output)
        used |= consumed_names(node)
    return used - defined - {""}


def _value_info(name: str, info: TensorInfo | None, declared: onnx.ValueInfoProto | None = None
                ) -> onnx.ValueInfoProto | None:
    """`name` declared with `info`'s type and shape; the declaration the body has where `info`
    knows nothing; None where neither gives a tensor type (the name is then left undeclared)."""
    if info is None or not info.elem_type:
        if declared is not None and declared.type.HasField("tensor_type"):
            return declared
        return None
    if info.shape is None:
        return helper.make_tensor_value_info(name, info.elem_type, None)
    dims = [d if isinstance(d, (int, str)) else None for d in info.shape]
    return helper.make_tensor_value_info(name, info.elem_type, dims)


def _as_model(graph: onnx.GraphProto, inputs: list[onnx.ValueInfoProto], opset: int, *, declared: bool
              ) -> onnx.ModelProto:
    """`graph` as a model read from `inputs`. `declared` False drops the shapes the body declares
    inside (value_info, outputs): written with the body's own symbols (`N` where the outer graph
    binds it), they would stand over the sizes inferred from the bound inputs."""
    body = onnx.GraphProto(name=graph.name)
    body.input.extend(inputs)
    if declared:
        body.output.extend(graph.output)
        body.value_info.extend(graph.value_info)
    else:
        body.output.extend(helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
                           if o.type.HasField("tensor_type") else o for o in graph.output)
    body.initializer.extend(graph.initializer)
    body.sparse_initializer.extend(graph.sparse_initializer)
    body.node.extend(graph.node)
    return helper.make_model(body, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
