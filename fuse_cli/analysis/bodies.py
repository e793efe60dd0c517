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
onnxruntime's planner, which compares shapes before any dim is bound). Where an If's branches
differ in rank onnx leaves its outputs unknown, and everything after them: the branch that runs,
decided by shape arithmetic at the bound dims (silero-vad squeezes a dim where it is 1), gives
them, and the body is inferred again with them declared.

Which If branch runs: the one a constant condition names, or one computed from constants and
shapes at the bound dims (`Scope`); else the larger, unless onnx cannot size one of them at
these shapes, which is then taken not to run (silero-vad's 8 kHz branch at a 16 kHz window:
onnxruntime fails in it), and the sized one is counted. Measured (estimate / allocated, memray):
an If with a 4x larger branch 0.999, an accumulating Loop 0.999, a Scan RNN 0.998
(tests/test_analysis_bodies.py); the four silero-vad exports with an If at 64 and 256 windows
0.98-1.00.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuse_cli.analysis.shape_values import MAX_ELEMENTS, evaluate_shape_values, evaluates, initial_values
from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, infer_shapes
from fuse_cli.core.order import consumed_names, outer_references

# (domain, op_type) of the nodes whose bodies are counted
CONTROL_FLOW_OPS = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})
# A constant read as an If condition or a Loop trip count is a scalar: bigger ones are not read.
_SMALL_CONSTANT = 8
_CACHE_KEPT = 64


@dataclass(frozen=True)
class BodyCost:
    """What one control-flow node's body adds at its step (`scratch_bytes`), and the shapes of its
    outputs that the outer shape table left unknown and the body gives (`outputs`, at the bound
    dims; onnx leaves a Loop's outputs and an If's whose branches differ unknown).
    `counted`: the branch or body counted; `reason`: why that one ("larger", "the condition is a
    constant true", "one iteration"); `body_peak`: its own peak; `iterations`: a Loop's trip count
    or a Scan's sequence length where known; `unknown`: body tensors of unknown size."""

    node: str
    op_type: str
    counted: str
    reason: str
    body_peak: int
    scratch_bytes: int
    iterations: int | None = None
    outputs: Mapping[str, TensorInfo] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    other_peak: int | None = None  # the If branch not counted: its peak

    @property
    def output_bytes(self) -> dict[str, int]:
        return {name: size for name, info in self.outputs.items() if (size := info.nbytes()) is not None}


@dataclass(frozen=True)
class Scope:
    """What a graph's control-flow nodes take from it before they run: what may decide them, the
    If conditions and Loop trip counts (`wanted`) and the nodes that compute them from constants
    and shapes (silero-vad's Not(Equal(Size(Shape(x)), 2)) inside its branches), with the small
    initializers those read; and the small constants their bodies read (`constants`: a Pad's
    pads, a Reshape's shape, which a body's shape inference needs as values)."""

    wanted: tuple[str, ...] = ()
    nodes: tuple[onnx.NodeProto, ...] = ()
    initializers: tuple[onnx.TensorProto, ...] = ()
    constants: Mapping[str, onnx.TensorProto] = field(default_factory=dict)

    def values(self, shapes: ShapeTable, opset: int) -> dict[str, np.ndarray]:
        """The values of `wanted` that hold at `shapes`' bound dims."""
        if not self.wanted:
            return {}

        def shape_of(name: str) -> tuple[int, ...] | None:
            info = shapes.get(name)
            return info.shape if info is not None and info.nbytes() is not None else None

        values = initial_values(list(self.initializers))
        evaluate_shape_values(list(self.nodes), shape_of, opset, values)
        return {name: value for name in self.wanted if (value := values.get(name)) is not None
                and value.size <= _SMALL_CONSTANT}


def scope(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto]) -> Scope:
    """The Scope of `nodes` (control-flow nodes of `graph`): their conditions' nodes, walked back
    through what shape arithmetic evaluates and stopping at Shape and Size (they read a shape, not
    a value), and the small constants their bodies read."""
    if not nodes:
        return Scope()
    read_inside = set().union(*(outer_references(g) for node in nodes for g in _graphs(node)))
    constants = {name: tensor for name, tensor in _small_constants(graph).items() if name in read_inside}
    wanted = []
    for node in nodes:
        # a Loop's trip count, condition and carried values: a condition computed in the body from
        # a counter it carries (tf2onnx's while loops) runs as many times as those say
        wanted += node.input[:1] if node.op_type == "If" else node.input if node.op_type == "Loop" else []
    wanted = tuple(name for name in wanted if name)
    if not wanted:
        return Scope(constants=constants)
    stored = list(graph.node)
    producer = {name: index for index, node in enumerate(stored) for name in node.output if name}
    small = {t.name: t for t in graph.initializer if math.prod(t.dims) <= _SMALL_CONSTANT}
    seen, stack, sliced, read = set(), list(wanted), set(), set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        index = producer.get(name)
        node = stored[index] if index is not None else None
        if node is None:
            read.add(name)
        elif node.domain in ("", "ai.onnx") and evaluates(node.op_type):
            sliced.add(index)
            if node.op_type not in ("Shape", "Size"):
                stack.extend(i for i in node.input if i)
    ordered = tuple(stored[index] for index in sorted(sliced))
    return Scope(wanted, ordered, tuple(small[name] for name in sorted(read) if name in small), constants)


def _graphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


def _small_constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant values of `graph` small enough to be shapes or indices, held in
    the file (not external data)."""
    found = {t.name: t for t in graph.initializer
             if math.prod(t.dims) <= MAX_ELEMENTS and t.data_location != TensorProto.EXTERNAL}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None and math.prod(value.dims) <= MAX_ELEMENTS:
                tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
                tensor.name = node.output[0]
                found[node.output[0]] = tensor
    return found


def body_cost(node: onnx.NodeProto, label: str, shapes: ShapeTable, planner: Mapping[str, TensorInfo],
              opset: int, outer: Scope) -> BodyCost | None:
    """The cost of `node`'s body at `shapes` (the outer graph's sizes; `planner`: its shapes as
    onnxruntime's planner sees them; `outer`: the outer graph's Scope); None for a node that is
    not an If, Loop or Scan, or whose body cannot be read."""
    constants = outer.values(shapes, opset)
    key = _cache_key(node, shapes, planner, opset, constants)
    if key in _CACHE:
        cost = _CACHE[key]
        return None if cost is None else dataclasses.replace(cost, node=label)
    cost = _compute(node, label, shapes, planner, _Outside(opset, outer.constants), constants)
    if len(_CACHE) >= _CACHE_KEPT:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = cost
    return cost


# By the node's bytes and everything the cost reads of the outer graph: a candidate model keeps
# most control-flow nodes as they were, and the peak guard walks each candidate.
_CACHE: dict[tuple, BodyCost | None] = {}


def _cache_key(node: onnx.NodeProto, shapes: ShapeTable, planner: Mapping[str, TensorInfo], opset: int,
               constants: Mapping[str, np.ndarray]) -> tuple:
    names = sorted(consumed_names(node) | set(node.output))
    infos = tuple((shapes.get(name), planner.get(name)) for name in names)
    values = tuple((name, constants[name].tobytes()) for name in names if name in constants)
    return node.SerializeToString(), opset, infos, values


@dataclass(frozen=True)
class _Outside:
    """The enclosing graph as its bodies see it, besides its shapes: its opset, and the small
    constants it gives them."""

    opset: int
    constants: Mapping[str, onnx.TensorProto]


def _compute(node: onnx.NodeProto, label: str, shapes: ShapeTable, planner: Mapping[str, TensorInfo],
             outside: _Outside, constants: Mapping[str, np.ndarray]) -> BodyCost | None:
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if node.op_type == "If" and {"then_branch", "else_branch"} <= graphs.keys():
        return _if_cost(node, label, graphs, shapes, planner, outside, constants)
    if node.op_type == "Loop" and "body" in graphs and len(graphs["body"].input) >= 2:
        return _loop_cost(node, label, graphs["body"], shapes, planner, outside, constants)
    if node.op_type == "Scan" and "body" in graphs:
        return _scan_cost(node, label, graphs["body"], shapes, planner, outside)
    return None


def _filled(node: onnx.NodeProto, shapes: ShapeTable, infos: Iterable[TensorInfo | None]) -> dict[str, TensorInfo]:
    """The node's outputs whose size `shapes` does not know and `infos` (by output) does."""
    return {name: TensorInfo(name, info.elem_type, info.shape) for name, info in zip(node.output, infos)
            if name and shapes.nbytes(name) is None and info is not None and info.nbytes() is not None}


def _outputs_bytes(node: onnx.NodeProto, shapes: ShapeTable, filled: Mapping[str, TensorInfo]) -> int:
    """The node's outputs' bytes as the outer walk counts them: known, or filled by the body."""
    return sum(size for name in node.output if name and (size := shapes.nbytes(name) if name not in filled
                                                         else filled[name].nbytes()) is not None)


def _with_length(info: TensorInfo | None, length: int | None, axis: int = 0) -> TensorInfo | None:
    """A scan output's shape: one iteration's, `length` of them stacked on `axis`."""
    if info is None or info.shape is None or length is None:
        return None
    shape = list(info.shape)
    shape.insert(axis % (len(shape) + 1), length)
    return TensorInfo(info.name, info.elem_type, tuple(shape))


def _if_cost(node, label, graphs, shapes, planner, outside, constants) -> BodyCost:
    walks = {name: _body(graphs[name], [], shapes, outside) for name in ("then_branch", "else_branch")}
    peaks = {name: walk.profile(planner).peak_bytes for name, walk in walks.items()}
    counted = _taken(node, constants)
    if counted is not None:
        reason = f"the condition is a constant {'true' if counted == 'then_branch' else 'false'}"
    else:
        # A branch onnx cannot size at these shapes is likely one they cannot run (silero-vad's
        # 8 kHz branch at a 16 kHz window): its peak is a floor, and the sized one is counted.
        sized = {name: not walk.profile(planner).unknown_tensors for name, walk in walks.items()}
        counted = max(peaks, key=lambda name: (sized[name], peaks[name], name == "then_branch"))
        reason = "larger" if peaks[counted] >= max(peaks.values()) else \
            f"the {_other(counted)} has sizes unknown at these shapes"
    walk = walks[counted]
    filled = _filled(node, shapes, (walk.table.get(o.name) for o in graphs[counted].output))
    outputs = _outputs_bytes(node, shapes, filled)
    return BodyCost(label, "If", counted, reason, peaks[counted], max(0, peaks[counted] - outputs),
                    outputs=filled, unknown=walk.profile(planner).unknown_tensors, other_peak=peaks[_other(counted)])


def _taken(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> str | None:
    """The branch an If takes where its condition is known before it runs."""
    condition = constants.get(node.input[0]) if node.input else None
    if condition is None or condition.size != 1:
        return None
    return "then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"


def _other(branch: str) -> str:
    return "else_branch" if branch == "then_branch" else "then_branch"


def _loop_body(node: onnx.NodeProto, body: onnx.GraphProto, shapes: ShapeTable, outside: _Outside,
               constants: Mapping[str, np.ndarray]) -> tuple[_Body, int | None, dict[str, TensorInfo]]:
    """The Loop's body at its carried inputs' shapes, its trip count where known, and the Loop's
    outputs the table leaves unknown: the carried ones as one iteration leaves them, the scan
    outputs as the trip count's iterations stacked."""
    declared = list(body.input)
    carried = len(node.input[2:])
    counters = [(declared[0], TensorInfo("", TensorProto.INT64, ())),
                (declared[1], TensorInfo("", TensorProto.BOOL, ()))]
    walk = _body(body, counters + [(vi, shapes.get(name)) for vi, name in zip(declared[2:], node.input[2:])],
                 shapes, outside)
    iterations = _trip_count(node, body, outside, constants)
    if iterations is None:  # the trip count from a scan output's length, where the table knows it
        lengths = {info.shape[0] for name in node.output[carried:] if (info := shapes.get(name)) is not None
                   and info.shape and isinstance(info.shape[0], int)}
        iterations = lengths.pop() if len(lengths) == 1 else None
    infos = [walk.table.get(o.name) for o in body.output[1:]]
    filled = _filled(node, shapes, infos[:carried] + [_with_length(info, iterations) for info in infos[carried:]])
    return walk, iterations, filled


# The most iterations a Loop's condition is followed for; past it, the trip count is unknown.
_MAX_SIMULATED_ITERATIONS = 1 << 16


def _trip_count(node: onnx.NodeProto, body: onnx.GraphProto, outside: _Outside,
                constants: Mapping[str, np.ndarray]) -> int | None:
    """The iterations a Loop runs: its trip count M, unless its condition stops it before. The
    condition is followed where it is scalar arithmetic on the iteration number and the carried
    values known before the Loop runs (tf2onnx's while loops carry a counter and the sequence
    length, with no M: `i < T`), iteration by iteration as the body computes it. None where
    neither M nor the condition is known."""
    value = constants.get(node.input[0]) if node.input and node.input[0] else None
    trips = int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None
    condition = constants.get(node.input[1]) if len(node.input) > 1 and node.input[1] else np.array(True)
    if condition is None or condition.size != 1:
        return trips
    declared = [vi.name for vi in body.input]
    carried = [constants.get(name) for name in node.input[2:]]
    steps = list(body.node)
    fixed = [*body.initializer, *(outside.constants[name] for name in sorted(outer_references(body))
                                  if name in outside.constants)]
    for iteration in range(trips if trips is not None else _MAX_SIMULATED_ITERATIONS):
        if not bool(condition.reshape(-1)[0]):
            return iteration
        values = initial_values(fixed)
        values[declared[0]], values[declared[1]] = np.array(iteration, np.int64), condition
        values.update((name, value) for name, value in zip(declared[2:], carried) if value is not None)
        evaluate_shape_values(steps, lambda _name: None, outside.opset, values)
        condition = values.get(body.output[0].name)
        if condition is None or condition.size != 1:  # not arithmetic on known values: M says
            return trips
        carried = [values.get(o.name) for o in body.output[1:1 + len(carried)]]
    return trips


def _loop_cost(node, label, body, shapes, planner, outside, constants) -> BodyCost:
    walk, iterations, filled = _loop_body(node, body, shapes, outside, constants)
    feeds = [vi.name for vi in body.input]
    planner_feeds = [TensorInfo("", TensorProto.INT64, ()), TensorInfo("", TensorProto.BOOL, ())]
    profile = walk.profile(planner, planner_feeds + [planner.get(name) for name in node.input[2:]], feeds_counted=False)
    carried = len(node.input[2:])
    carried_bytes = sum(walk.table.nbytes(name) or 0 for name in feeds[2:])
    piece = sum(walk.table.nbytes(o.name) or 0 for o in body.output[1 + carried:])
    outputs = _outputs_bytes(node, shapes, filled)
    n = iterations if iterations is not None else 2  # unknown: at least one iteration's carried values before
    last_iteration = (carried_bytes if n > 1 else 0) + profile.peak_bytes + max(n - 1, 0) * piece
    # at the end the last two iterations' carried values are both held (feeds and fetches)
    end = (carried_bytes if n > 1 else 0) + carried_bytes + n * piece if n else 0
    return BodyCost(label, "Loop", "body", "one iteration", profile.peak_bytes,
                    max(last_iteration - outputs, end, 0), iterations, filled, profile.unknown_tensors)


def _scan_body(node: onnx.NodeProto, body: onnx.GraphProto, shapes: ShapeTable, outside: _Outside
               ) -> tuple[_Body, int | None, dict[str, TensorInfo]]:
    """The Scan's body at one step's shapes, the sequence length where known, and the Scan's
    outputs the table leaves unknown."""
    attrs = _attributes(node)
    states = len(body.input) - int(attrs.get("num_scan_inputs", 0))
    inputs, length = [], None
    for index, (vi, name) in enumerate(zip(body.input, node.input)):
        info = shapes.get(name)
        if index >= states:
            axis = _scan_axes(attrs, "scan_input_axes", len(body.input) - states)[index - states]
            if info is not None and info.shape and isinstance(info.shape[axis % len(info.shape)], int):
                length = info.shape[axis % len(info.shape)]
            info = _without_axis(info, axis)
        inputs.append((vi, info))
    walk = _body(body, inputs, shapes, outside)
    infos = [walk.table.get(o.name) for o in body.output]
    output_axes = _scan_axes(attrs, "scan_output_axes", len(body.output) - states)
    filled = _filled(node, shapes, infos[:states] + [_with_length(info, length, axis)
                                                     for info, axis in zip(infos[states:], output_axes)])
    return walk, length, filled


def _scan_cost(node, label, body, shapes, planner, outside) -> BodyCost:
    walk, length, filled = _scan_body(node, body, shapes, outside)
    attrs = _attributes(node)
    scans = int(attrs.get("num_scan_inputs", 0))
    states = len(body.input) - scans
    input_axes = _scan_axes(attrs, "scan_input_axes", scans)
    planner_feeds = [planner.get(name) if index < states
                     else _without_axis(planner.get(name), input_axes[index - states])
                     for index, name in enumerate(node.input[:len(body.input)])]
    profile = walk.profile(planner, planner_feeds, feeds_counted=False, fetches_counted=False)
    state_bytes = sum(walk.table.nbytes(vi.name) or 0 for vi in body.input[:states])
    n = length if length is not None else 3
    buffers = state_bytes * ((n > 1) + (n > 2))
    transposed = sum(shapes.nbytes(name) or 0 for name, axis in zip(node.input[states:], input_axes)
                     if axis % max(len((shapes.get(name) or TensorInfo("", 0, ())).shape or ()), 1))
    transposed += sum(shapes.nbytes(name) or 0 for name, axis in
                      zip(node.output[states:],
                          _scan_axes(attrs, "scan_output_axes", len(body.output) - states)) if axis)
    return BodyCost(label, "Scan", "body", "one iteration", profile.peak_bytes,
                    profile.peak_bytes + buffers + transposed, length, filled, profile.unknown_tensors)


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _scan_axes(attrs: Mapping, name: str, count: int) -> list[int]:
    return list(attrs.get(name) or [0] * count)


def _without_axis(info: TensorInfo | None, axis: int) -> TensorInfo | None:
    if info is None or info.shape is None or not info.shape:
        return None
    shape = list(info.shape)
    del shape[axis % len(shape)]
    return TensorInfo(info.name, info.elem_type, tuple(shape))


def control_flow_outputs(graph: onnx.GraphProto, shapes: ShapeTable, opset: int) -> dict[str, TensorInfo]:
    """The shapes of the outputs of `graph`'s If, Loop and Scan nodes that `shapes` leaves unknown
    and their bodies give at its dims: an If's where its condition is decided (a constant, or
    shape arithmetic at these dims), a Loop's and a Scan's from one iteration (shapes.py declares
    them and infers again, so that what reads them is sized too)."""
    nested = [node for node in graph.node
              if ("" if node.domain == "ai.onnx" else node.domain, node.op_type) in CONTROL_FLOW_OPS
              and any(name and shapes.nbytes(name) is None for name in node.output)]
    if not nested:
        return {}
    outer = scope(graph, nested)
    constants, outside = outer.values(shapes, opset), _Outside(opset, outer.constants)
    found: dict[str, TensorInfo] = {}
    for node in nested:
        graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        if node.op_type == "If" and {"then_branch", "else_branch"} <= graphs.keys():
            taken = _taken(node, constants)
            if taken is not None:  # the larger branch is a guess at which runs: its shapes are not declared
                branch = graphs[taken]
                walk = _body(branch, [], shapes, outside)
                found.update(_filled(node, shapes, (walk.table.get(o.name) for o in branch.output)))
        elif node.op_type == "Loop" and "body" in graphs and len(graphs["body"].input) >= 2:
            found.update(_loop_body(node, graphs["body"], shapes, outside, constants)[2])
        elif node.op_type == "Scan" and "body" in graphs:
            found.update(_scan_body(node, graphs["body"], shapes, outside)[2])
    return found


class _Body:
    """One body as a model of its own: its inputs (and the outer-scope values it reads) declared at
    the outer shapes, inferred at the bound ones (`table`); its walk inferred again at the symbolic
    ones the planner compares (`profile`)."""

    def __init__(self, graph: onnx.GraphProto, inputs: Sequence[tuple], shapes: ShapeTable, outside: _Outside):
        self.graph, self.opset = graph, outside.opset
        self.declared = [vi for vi, _ in inputs]
        self.outer = sorted(outer_references(graph))
        # the small outer constants as the body's own initializers: inference reads their values
        self.constants = [outside.constants[name] for name in self.outer if name in outside.constants]
        bound = [_value_info(vi.name, info, vi) for vi, info in inputs]
        bound += [_value_info(name, shapes.get(name)) for name in self.outer if name not in outside.constants]
        self.model = _as_model(graph, [vi for vi in bound if vi is not None], self.opset, self.constants,
                               declared=False)
        self.table = infer_shapes(self.model)
        self._profiles: dict[tuple, object] = {}

    def profile(self, planner: Mapping[str, TensorInfo], feeds: Sequence[TensorInfo | None] = (),
                feeds_counted: bool = True, fetches_counted: bool = True):
        """The body's liveness walk, its inputs (`feeds`) and outer-scope values at the outer
        graph's `planner` shapes for onnxruntime's planner. Outer-scope values, and its inputs
        unless `feeds_counted`, are weights to it: counted by the walk outside or by the kernel's
        rule. Its outputs are left out unless `fetches_counted` (Scan writes them into buffers
        counted apart)."""
        from fuse_cli.analysis.memory import profile_memory  # walk_setup.py, under it, calls this module

        outer = [planner.get(name) for name in self.outer]
        key = (tuple(feeds), tuple(outer), feeds_counted, fetches_counted)
        if key not in self._profiles:
            symbolic = [_value_info(vi.name, info, vi) for vi, info in zip(self.declared, feeds)]
            symbolic += [_value_info(name, info) for name, info in zip(self.outer, outer)
                         if all(name != t.name for t in self.constants)]
            symbolic_model = _as_model(self.graph, [vi for vi in symbolic if vi is not None], self.opset,
                                       self.constants, declared=True)
            weights = set(self.outer) | (set() if feeds_counted else {vi.name for vi in self.declared})
            absent = () if fetches_counted else [o.name for o in self.graph.output]
            self._profiles[key] = profile_memory(self.model, self.table, extra_weights=weights, absent=absent,
                                                 symbolic_shapes=infer_shapes(symbolic_model))
        return self._profiles[key]


def _body(graph: onnx.GraphProto, inputs: Sequence[tuple], shapes: ShapeTable, outside: _Outside) -> _Body:
    """_Body, kept for the same graph at the same outer shapes: shapes.py resolves a node's
    outputs through its body, and the memory walk then counts the same body."""
    names = sorted(outer_references(graph))
    key = (graph.SerializeToString(), outside.opset, tuple((vi.name, info) for vi, info in inputs),
           tuple(shapes.get(name) for name in names),
           tuple(outside.constants[name].SerializeToString() for name in names if name in outside.constants))
    body = _BODIES.get(key)
    if body is None:
        if len(_BODIES) >= _CACHE_KEPT:
            _BODIES.pop(next(iter(_BODIES)))
        body = _BODIES[key] = _Body(graph, inputs, shapes, outside)
    return body


_BODIES: dict[tuple, _Body] = {}


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


def _as_model(graph: onnx.GraphProto, inputs: list[onnx.ValueInfoProto], opset: int,
              constants: Sequence[onnx.TensorProto], *, declared: bool) -> onnx.ModelProto:
    """`graph` as a model read from `inputs`. `declared` False drops the shapes the body declares
    inside (value_info, outputs): written with the body's own symbols (`N` where the outer graph
    binds it), they would stand over the sizes inferred from the bound inputs."""
    body = onnx.GraphProto(name=graph.name)
    body.input.extend(inputs)
    if declared:
        body.output.extend(graph.output)
        body.value_info.extend(graph.value_info)
    else:
        # An output that passes an input through keeps the input's declaration: onnx's inference
        # takes an output's declared type over the input's, and a shapeless one would leave
        # every reader of that input unknown (tf2onnx's Loop bodies pass their weights through).
        given = {vi.name: vi for vi in inputs}
        body.output.extend(given[o.name] if o.name in given
                           else helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
                           if o.type.HasField("tensor_type") else o for o in graph.output)
    body.initializer.extend(graph.initializer)
    body.initializer.extend(constants)
    body.sparse_initializer.extend(graph.sparse_initializer)
    body.node.extend(graph.node)
    return helper.make_model(body, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
