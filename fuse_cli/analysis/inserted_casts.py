"""The Casts onnxruntime's CPU provider inserts around float16 nodes it has no float16 kernel for,
replayed on a graph's nodes: what the memory walk must count on the CPU provider.

onnxruntime's InsertCastTransformer (onnxruntime/core/optimizer/insert_cast_transformer.cc) runs
at every optimization level, after partitioning:
1. A node with a float16 kernel whose float16 inputs all come from nodes without one, and whose
   float16 outputs feed nodes, is run in float32 too (ForceSingleNodeCPUFloat16ToFloat32), so a
   chain is not cast back and forth around it. Not for a node with a subgraph, one writing a graph
   output, or one reading only graph inputs and weights; not when the graph has one node.
2. In onnxruntime's execution order, each node without a float16 kernel reads each float16 input
   through a Cast to float32 (one Cast per tensor, shared by every such reader; a weight's Cast
   reads only the weight) and writes each float16 output in float32, cast back by a new Cast. The
   Casts are added in that order, after every node there is: they take the highest indices, which
   steers the execution order (core/order.py) and runs every weight's Cast early. Each new float32
   tensor is created with a type and no shape; the graph is then resolved, every Cast still there,
   and that inference shapes it (CastPlan.inserted; walk_setup._shapes_with_every_cast).
3. Duplicate Casts are removed (RemoveDuplicateCastTransformer), nodes in index order: a Cast
   whose reader Cast casts back to its input's type (float32 -> float16 -> float32) is skipped by
   that reader's readers, and a Cast every reader of which is a Cast goes, those Casts reading
   its input instead; never one writing a graph output.
The float32 tensors are named as onnxruntime names them (InsertedPrecisionFreeCast_<tensor>).
Subgraphs are not rewritten here: a control-flow body is walked as stored.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from fuse_cli.ops.cpu_float16 import has_cpu_float16_kernel, inlined_at_float16

FLOAT16, FLOAT = TensorProto.FLOAT16, TensorProto.FLOAT
CAST_PREFIX = "InsertedPrecisionFreeCast_"

_BOOL, _SIGNED, _UNSIGNED, _FLOATING = "bool", "signed", "unsigned", "floating"
_KINDS = {TensorProto.BOOL: (_BOOL, 1),
          TensorProto.INT8: (_SIGNED, 8), TensorProto.INT16: (_SIGNED, 16), TensorProto.INT32: (_SIGNED, 32),
          TensorProto.INT64: (_SIGNED, 64), TensorProto.UINT8: (_UNSIGNED, 8), TensorProto.UINT16: (_UNSIGNED, 16),
          TensorProto.UINT32: (_UNSIGNED, 32), TensorProto.UINT64: (_UNSIGNED, 64),
          TensorProto.BFLOAT16: (_FLOATING, 16), FLOAT16: (_FLOATING, 16), FLOAT: (_FLOATING, 32),
          TensorProto.DOUBLE: (_FLOATING, 64)}


def _unsafe_cast(source: int | None, target: int | None, name: str) -> bool:
    """RemoveDuplicateCastTransformer's UnsafeCast: whether a Cast from `source` to `target` may
    lose what a Cast back would not restore. A narrowing float Cast onnxruntime inserted itself
    (named CAST_PREFIX...) is not one: it only undoes its own widening."""
    if source not in _KINDS or target not in _KINDS:
        return True
    (src_kind, src_bits), (dst_kind, dst_bits) = _KINDS[source], _KINDS[target]
    if src_kind in (_SIGNED, _FLOATING) and dst_kind == _UNSIGNED:
        return True
    if src_kind == _FLOATING and dst_kind != _FLOATING:
        return True
    if src_kind == _UNSIGNED and dst_kind == _SIGNED:
        return dst_bits <= src_bits
    if src_kind in (_SIGNED, _UNSIGNED) and dst_kind == _FLOATING:
        return dst_bits <= src_bits
    if {source, target} == {FLOAT16, TensorProto.BFLOAT16}:
        return True
    return src_bits > dst_bits and not name.startswith(CAST_PREFIX)


@dataclass
class Step:
    """A node of the graph onnxruntime runs: a stored node (`stored`: its index) with its inputs and
    outputs as rewired, or an inserted Cast (`stored` None, `to` its target type). `index`: its
    index in onnxruntime's graph. `implicit`: the outer tensors its subgraphs read, which no Cast
    rewires: onnxruntime counts the node among their readers, so a float16 tensor an If body reads
    keeps its producer's Cast back and a node writing it is never run in float32 alone."""

    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    index: int
    stored: int | None = None
    name: str = ""
    to: int | None = None
    implicit: tuple[str, ...] = ()


@dataclass
class CastPlan:
    """The nodes onnxruntime runs (stored ones and inserted Casts, by onnxruntime index) and each
    float32 tensor the Casts add, with the tensor whose shape it has. `inserted`: the nodes as they
    were before duplicate Casts were removed, every Cast still there: the graph onnxruntime
    infers the new tensors' shapes on first (walk_setup._shapes_with_every_cast)."""

    steps: list[Step]
    float_copies: dict[str, str] = field(default_factory=dict)
    inserted: list[Step] = field(default_factory=list)


def inserted_casts(steps: Sequence[Step], elem_type: Callable[[str], int | None], graph_outputs: set[str],
                   opset: int, has_subgraph: Callable[[Step], bool], order: Callable[[list[Step]], list[int]],
                   numbered_after: int | None = None) -> CastPlan | None:
    """The graph of `steps` (stored nodes, each with its onnxruntime index) as onnxruntime's CPU
    provider runs it, or None when it inserts no Cast. `elem_type`: each tensor's element type;
    `order(steps)`: onnxruntime's execution order of `steps` (positions); `numbered_after`: the
    highest index onnxruntime's graph has before the Casts, where that is not a step's (an inlined
    body's leaf: inlined_bodies.py)."""
    steps = [Step(s.op_type, s.domain, list(s.inputs), list(s.outputs), s.index, s.stored, s.name, implicit=s.implicit)
             for s in steps]
    types: dict[str, int | None] = {}

    def type_of(name: str) -> int | None:
        if name not in types:
            types[name] = elem_type(name) if name else None
        return types[name]

    def float16_inputs(step: Step) -> list[str]:
        return [name for name in step.inputs if name and type_of(name) == FLOAT16]

    # a node the provider inlines as its function body gets no Cast itself (the body is not replayed:
    # it is walked as one node, as its float16 self)
    unassigned = [bool(float16_inputs(s)) and not has_cpu_float16_kernel(s.domain, s.op_type, opset)
                  and not inlined_at_float16(s.domain, s.op_type) for s in steps]
    if not any(unassigned):
        return None
    producer = {name: i for i, s in enumerate(steps) for name in s.outputs if name}
    readers = _readers(steps)

    def needs_input_cast(i: int) -> bool:
        return unassigned[i] and bool(float16_inputs(steps[i]))

    for i in sorted(range(len(steps)), key=lambda i: steps[i].index):
        if not unassigned[i] and not has_subgraph(steps[i]) and _isolated(
                steps[i], producer, readers, graph_outputs, opset, needs_input_cast, type_of):
            unassigned[i] = True

    float_copies: dict[str, str] = {}
    cast_of: dict[str, str] = {}  # float16 tensor -> its float32 copy
    added: list[Step] = []
    next_index = max((s.index for s in steps), default=-1) + 1
    if numbered_after is not None:
        next_index = max(next_index, numbered_after + 1)
    taken = {name for s in steps for name in (*s.inputs, *s.outputs)}

    def new_name(tensor: str) -> str:
        """CAST_PREFIX + tensor, made unique as onnxruntime's Graph::GenerateNodeName makes it (the
        Cast back of a node's output and a later Cast of that output would share it)."""
        name, count = CAST_PREFIX + tensor, 0
        while name in taken:
            count += 1
            name = f"{CAST_PREFIX}{tensor}_token_{count}"
        taken.add(name)
        return name
    for i in order(steps):
        step = steps[i]
        if not unassigned[i] or has_subgraph(step) or not float16_inputs(step):
            continue
        for position, name in enumerate(step.inputs):
            if name and type_of(name) == FLOAT16:
                if name not in cast_of:
                    copy = cast_of[name] = new_name(name)
                    float_copies[copy], types[copy] = name, FLOAT
                    added.append(Step("Cast", "", [name], [copy], next_index, name=copy, to=FLOAT))
                    next_index += 1
                step.inputs[position] = cast_of[name]
        for position, name in enumerate(step.outputs):
            if name and type_of(name) == FLOAT16:
                copy = new_name(name)
                float_copies[copy], types[copy] = name, FLOAT
                step.outputs[position] = copy
                added.append(Step("Cast", "", [copy], [name], next_index, name=copy, to=FLOAT16))
                next_index += 1
    steps.extend(added)
    inserted = [dataclasses.replace(s, inputs=list(s.inputs), outputs=list(s.outputs)) for s in steps]
    steps = _without_duplicate_casts(steps, type_of, graph_outputs)
    live = {name for s in steps for name in (*s.inputs, *s.outputs)}
    return CastPlan(steps, {copy: source for copy, source in float_copies.items() if copy in live}, inserted)


def _isolated(step: Step, producer: Mapping[str, int], readers: Mapping[str, list[int]], graph_outputs: set[str],
              opset: int, needs_input_cast, type_of) -> bool:
    """IsIsolatedFp16NodeOnCpu: a node with a float16 kernel, reading some node's output, whose
    float16 inputs written by nodes are all written by nodes that are cast, and whose float16
    outputs are read only by such nodes. As onnxruntime reads its schema, only the first tensor
    given to each formal input or output counts (a variadic one: its first)."""
    if any(name in graph_outputs for name in step.outputs) or not any(
            name in producer for name in step.inputs if name):
        return False
    if step.op_type == "Cast" and step.domain in ("", "ai.onnx"):
        return False  # measured: a float16 Cast between cast nodes stays (its `to` fixes its output)
    inputs = _first_of_each_formal(step, step.inputs, opset, inputs=True)
    outputs = _first_of_each_formal(step, step.outputs, opset, inputs=False)
    if not any(type_of(name) == FLOAT16 for name in inputs):
        return False
    if any(type_of(name) == FLOAT16 and name in producer and not needs_input_cast(producer[name]) for name in inputs):
        return False
    float16_outputs = [name for name in outputs if type_of(name) == FLOAT16]
    return bool(float16_outputs) and all(needs_input_cast(k) for name in float16_outputs for k in readers.get(name, ()))


def _first_of_each_formal(step: Step, names: Sequence[str], opset: int, inputs: bool) -> list[str]:
    """The first present tensor given to each of the operator's formal inputs (or outputs) whose
    type is a type constraint: a variadic one's first. Without a schema (another domain than
    onnx's), each tensor is its own."""
    formals = _formals(step.domain, step.op_type, opset, inputs)
    if formals is None:
        return [name for name in names if name]
    chosen, position = [], 0
    for variadic, constrained in formals:
        count = max(len(names) - position, 0) if variadic else 1
        given = [name for name in names[position:position + count] if name]
        if constrained and given and inputs:
            chosen.append(given[0])
        elif constrained and not inputs and position < len(names) and names[position]:
            chosen.append(names[position])  # outputs: by the formal's index, as onnxruntime reads them
        position += count
    return chosen


@functools.lru_cache(maxsize=512)
def _formals(domain: str, op_type: str, opset: int, inputs: bool) -> tuple[tuple[bool, bool], ...] | None:
    """(variadic, type-constrained) per formal input or output of the operator's schema at `opset`."""
    if domain not in ("", "ai.onnx"):
        return None
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    constraints = {c.type_param_str for c in schema.type_constraints}
    formals = schema.inputs if inputs else schema.outputs
    return tuple((f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic, f.type_str in constraints)
                 for f in formals)


def _readers(steps: Sequence[Step]) -> dict[str, list[int]]:
    """Each tensor's readers (positions in `steps`): through an input, or through a subgraph."""
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for name in (*s.inputs, *s.implicit):
            if name:
                readers.setdefault(name, []).append(i)
    return readers


def _without_duplicate_casts(steps: list[Step], type_of, graph_outputs: set[str]) -> list[Step]:
    """RemoveDuplicateCastTransformer over `steps`, Casts in index order, each seeing the graph as
    the ones before left it."""
    alive = [True] * len(steps)
    readers = _readers(steps)

    def reroute(old: str, new: str) -> None:
        for k in readers.pop(old, []):
            if alive[k]:
                steps[k].inputs = [new if name == old else name for name in steps[k].inputs]
                readers.setdefault(new, []).append(k)

    for i in sorted(range(len(steps)), key=lambda i: steps[i].index):
        cast = steps[i]
        if not alive[i] or cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx"):
            continue
        source, written = cast.inputs[0], cast.outputs[0]
        narrowing = _unsafe_cast(type_of(source), type_of(written), cast.name)
        children = [k for k in dict.fromkeys(readers.get(written, [])) if alive[k]
                    for _ in range(steps[k].inputs.count(written) + (written in steps[k].implicit))]
        removed, kept, inconsistent = [], [], False
        for k in dict.fromkeys(children):
            child = steps[k]
            if child.op_type != "Cast":
                continue
            child_source, child_written = type_of(child.inputs[0]), type_of(child.outputs[0])
            if narrowing and _unsafe_cast(child_written, child_source, child.name):
                inconsistent = True
                break
            if child.outputs[0] not in graph_outputs and type_of(source) == child_written \
                    and child_source == type_of(written):
                removed.append(k)
            else:
                kept.append(k)
        if inconsistent:
            continue
        for k in removed:
            alive[k] = False
            reroute(steps[k].outputs[0], source)
        cast_children = sum(children.count(k) for k in (*removed, *kept))
        if children and cast_children == len(children) and written not in graph_outputs:
            alive[i] = False
            reroute(written, source)
    return [s for s, keep in zip(steps, alive) if keep]


class WithFloatCopies:
    """A shape table that also knows the float32 copies the Casts add (`copies`: copy -> its
    float16 tensor), each with its float16 tensor's shape: what the memory rules read of a kernel
    run on them (ops.record.Shapes)."""

    def __init__(self, shapes, copies: Mapping[str, str]):
        self.shapes, self.copies = shapes, copies

    def get(self, name: str):
        source = self.copies.get(name)
        if source is None:
            return self.shapes.get(name)
        info = self.shapes.get(source)
        return None if info is None else dataclasses.replace(info, name=name, elem_type=FLOAT)

    def nbytes(self, name: str) -> int | None:
        info = self.get(name)
        return None if info is None else info.nbytes()


def order_with_inserted(stored: Sequence[int | None], inputs: Sequence[Sequence[str]], outputs: Sequence[Sequence[str]],
                        reads: Sequence[Sequence[str]], explicit: Sequence[int]) -> list[int]:
    """An order of stored nodes (`explicit`: stored indices) as an order of the nodes walked (each
    one's stored index, None for an inserted Cast, its inputs, outputs and reads): each inserted
    Cast right after the node writing its input, or, reading a weight or a graph input, right
    before its first reader. A stored Cast the replay removed is skipped."""
    position = {index: i for i, index in enumerate(stored) if index is not None}
    order = [position[index] for index in explicit if index in position]
    producer = {name: i for i, names in enumerate(outputs) for name in names}
    after: dict[int, list[int]] = {}
    before: dict[int | None, list[int]] = {}
    for i, index in enumerate(stored):
        if index is None:
            writer = producer.get(inputs[i][0])
            if writer is not None:
                after.setdefault(writer, []).append(i)
            else:
                copy = outputs[i][0]
                before.setdefault(next((k for k in order if copy in reads[k]), None), []).append(i)

    result: list[int] = []

    def emit(i: int) -> None:
        result.append(i)
        for k in after.get(i, ()):
            emit(k)

    for k in before.pop(None, []):
        emit(k)
    for k in order:
        for cast in before.get(k, ()):
            emit(cast)
        emit(k)
    return result
