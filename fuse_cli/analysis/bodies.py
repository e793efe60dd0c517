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
shapes at the bound dims (`Conditions`); else the larger, unless onnx cannot size one of them at
these shapes, which is then taken not to run (silero-vad's 8 kHz branch at a 16 kHz window:
onnxruntime fails in it), and the sized one is counted. Measured (estimate / allocated, memray):
an If with a 4x larger branch 0.999, an accumulating Loop 0.999, a Scan RNN 0.998, silero-vad
at 64 and 256 windows 0.98 and 0.99 (tests/test_analysis_bodies.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuse_cli.analysis.shape_values import evaluate_shape_values, evaluates, initial_values
from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, infer_shapes
from fuse_cli.core.order import consumed_names

# (domain, op_type) of the nodes whose bodies are counted
CONTROL_FLOW_OPS = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})
# A constant read as an If condition or a Loop trip count is a scalar: bigger ones are not read.
_SMALL_CONSTANT = 8
_CACHE_KEPT = 64
# Rounds of declaring nested control-flow outputs and inferring again (a chain of If nodes each
# reading the one before needs a round per link).
_RESOLVE_ROUNDS = 8


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
class Conditions:
    """What may decide a graph's control flow before it runs: the If conditions and Loop trip
    counts (`wanted`), the nodes that compute them from constants and shapes (silero-vad's
    Not(Equal(Size(Shape(x)), 2)) inside its branches) and the small initializers those read."""

    wanted: tuple[str, ...] = ()
    nodes: tuple[onnx.NodeProto, ...] = ()
    initializers: tuple[onnx.TensorProto, ...] = ()

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


def conditions(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto]) -> Conditions:
    """Conditions of `nodes` (control-flow nodes of `graph`): the nodes computing them, walked
    back through what shape arithmetic evaluates and stopping at Shape and Size (they read a
    shape, not a value)."""
    wanted = []
    for node in nodes:
        wanted += node.input[:1] if node.op_type == "If" else node.input[:2] if node.op_type == "Loop" else []
    wanted = tuple(name for name in wanted if name)
    if not wanted:
        return Conditions()
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
    return Conditions(wanted, ordered, tuple(small[name] for name in sorted(read) if name in small))


def body_cost(node: onnx.NodeProto, label: str, shapes: ShapeTable, planner: Mapping[str, TensorInfo],
              opset: int, constants: Mapping[str, np.ndarray]) -> BodyCost | None:
    """The cost of `node`'s body at `shapes` (the outer graph's sizes; `planner`: its shapes as
    onnxruntime's planner sees them); None for a node that is not an If, Loop or Scan, or whose
    body cannot be read."""
    key = _cache_key(node, shapes, planner, opset, constants)
    if key in _CACHE:
        cost = _CACHE[key]
        return None if cost is None else dataclasses.replace(cost, node=label)
    cost = _compute(node, label, shapes, planner, opset, constants)
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


def _compute(node: onnx.NodeProto, label: str, shapes: ShapeTable, planner: Mapping[str, TensorInfo],
             opset: int, constants: Mapping[str, np.ndarray]) -> BodyCost | None:
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if node.op_type == "If" and {"then_branch", "else_branch"} <= graphs.keys():
        return _if_cost(node, label, graphs, shapes, planner, opset, constants)
    if node.op_type == "Loop" and "body" in graphs and len(graphs["body"].input) >= 2:
        return _loop_cost(node, label, graphs["body"], shapes, planner, opset, constants)
    if node.op_type == "Scan" and "body" in graphs:
        return _scan_cost(node, label, graphs["body"], shapes, planner, opset)
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


def _if_cost(node, label, graphs, shapes, planner, opset, constants) -> BodyCost:
    walks = {name: _Body(graphs[name], [], shapes, planner, opset) for name in ("then_branch", "else_branch")}
    peaks = {name: walk.profile().peak_bytes for name, walk in walks.items()}
    condition = constants.get(node.input[0]) if node.input else None
    if condition is not None and condition.size == 1:
        counted, reason = ("then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"), \
            f"the condition is a constant {'true' if bool(condition.reshape(-1)[0]) else 'false'}"
    else:
        # A branch onnx cannot size at these shapes is likely one they cannot run (silero-vad's
        # 8 kHz branch at a 16 kHz window): its peak is a floor, and the sized branch is counted.
        sized = {name: not walk.profile().unknown_tensors for name, walk in walks.items()}
        counted = max(peaks, key=lambda name: (sized[name], peaks[name], name == "then_branch"))
        reason = "larger" if peaks[counted] >= max(peaks.values()) else \
            f"the {_other(counted)} has sizes unknown at these shapes"
    walk = walks[counted]
    filled = _filled(node, shapes, (walk.table.get(o.name) for o in graphs[counted].output))
    outputs = _outputs_bytes(node, shapes, filled)
    other = _other(counted)
    return BodyCost(label, "If", counted, reason, peaks[counted], max(0, peaks[counted] - outputs),
                    outputs=filled, unknown=walk.profile().unknown_tensors, other_peak=peaks[other])


def _other(branch: str) -> str:
    return "else_branch" if branch == "then_branch" else "then_branch"


def _loop_cost(node, label, body, shapes, planner, opset, constants) -> BodyCost:
    carried_names = list(node.input[2:])
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
    infos = [walk.table.get(name) for name in body_outputs[1:]]
    filled = _filled(node, shapes, infos[:carried] + [_with_length(info, iterations) for info in infos[carried:]])
    outputs = _outputs_bytes(node, shapes, filled)
    n = iterations if iterations is not None else 2  # unknown: at least one iteration's carried values before
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
    infos = [walk.table.get(o.name) for o in body.output]
    filled = _filled(node, shapes, infos[:states] + [_with_length(info, length, axis)
                                                     for info, axis in zip(infos[states:], output_axes)])
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
        self.symbolic_table = infer_shapes(self.symbolic_model)
        self.table = self._resolved(infer_shapes(self.model), opset)
        self._profiles: dict[tuple[bool, bool], object] = {}

    def _resolved(self, table: ShapeTable, opset: int) -> ShapeTable:
        """`table` with the outputs onnx left unknown of the control-flow nodes in this body (an If
        whose branches differ in rank: silero-vad's Squeeze in one, Identity in the other) taken
        from their own bodies, declared and inferred again, so that what reads them is sized too:
        a round per such node that reads another's output."""
        nested = [node for node in self.model.graph.node
                  if ("" if node.domain == "ai.onnx" else node.domain, node.op_type) in CONTROL_FLOW_OPS]
        decided = conditions(self.model.graph, nested)
        declared: dict[str, TensorInfo] = {}
        for _ in range(_RESOLVE_ROUNDS):
            constants = decided.values(table, opset)
            learnt = {}
            for node in nested:
                if any(name and table.nbytes(name) is None for name in node.output):
                    cost = body_cost(node, node.name, table, self.symbolic_table.tensors, opset, constants)
                    # the larger branch is a guess at which runs: its shapes are not declared
                    if cost is not None and (cost.op_type != "If" or cost.reason != "larger"):
                        learnt.update((name, info) for name, info in cost.outputs.items() if name not in declared)
            if not learnt:
                break
            declared.update(learnt)
            # a graph output's own declaration is where inference reads it (it would hide value_info)
            graph = self.model.graph
            for output in graph.output:
                if output.name in learnt:
                    output.CopyFrom(_value_info(output.name, learnt[output.name]))
            outputs = {o.name for o in graph.output}
            del graph.value_info[:]
            graph.value_info.extend(_value_info(name, info) for name, info in declared.items() if name not in outputs)
            table = infer_shapes(self.model)
        return table

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
                                                 symbolic_shapes=self.symbolic_table)
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
