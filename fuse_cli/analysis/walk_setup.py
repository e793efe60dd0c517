"""A model prepared for liveness walks: what every walk of it needs, built once and cached.

Per model (`WalkGraph`): each node's fields, producers, reads and kernel rules (views, in-place,
scratch: from each operator's record in fuse_cli/ops/), the planner's shapes and keys, the
weights; per shape table, each activation's bytes and each node's scratch. Per execution order
(`WalkSetup`): the steps' labels, who produced each tensor, each tensor's last read, and the
buffer plans (planner.py) by `absent` set. A scheduler judging many orders of one model, and the
audit's repeated walks (one per fusion pattern), share all of it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from fuse_cli.analysis.bodies import CONTROL_FLOW_OPS, BodyCost, Scope, body_cost, scope
from fuse_cli.analysis.inlined_bodies import InlinedBodies, inlined_bodies
from fuse_cli.analysis.inserted_casts import (FLOAT16, CastPlan, Step, WithFloatCopies, inserted_casts,
                                              order_with_inserted)
from fuse_cli.analysis.inference_runs import inference_copy
from fuse_cli.analysis.planner_shapes import planner_keys, planner_shapes_in_order
from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, infer_shapes
from fuse_cli.core.order import (checked_order, consumed_names, execution_order, may_hold_subgraphs, model_fingerprint,
                                 node_label, producers_of, runtime_numbering, runtime_order_by_producers)
from fuse_cli.ops import (FUNCTION_BODY_OPS, IN_PLACE, SCRATCH_OPS, VIEW_OPSETS, domain_of, held_workspace_bytes,
                          workspace_bytes)

INPUT_PRODUCER = "<input>"
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class WalkSizes:
    """What a model's walk needs from one shape table. held_workspace: the scratch of the steps
    whose kernel needs more when the plan writes its output into a held buffer (variadic ops)."""

    known: dict[str, int]
    unknown: tuple[str, ...]
    workspace: list[int]
    weight_bytes: int
    held_workspace: dict[int, int] = field(default_factory=dict)
    bodies: tuple[BodyCost, ...] = ()


@dataclass
class WalkGraph:
    """What a walk of one model needs that depends on neither the execution order nor `absent`,
    per node as stored: built once per model, symbolic table and weights, and shared by every
    order a scheduler judges and by the audit's repeated walks (one per fusion pattern). It holds
    no part of the model, whose weights it would otherwise keep alive."""

    model_id: int
    symbolic: ShapeTable | None
    fingerprint: bytes
    labels: list[str]
    op_types: list[str]
    producers: list[tuple[int, ...]]     # each node's producers (stored indices, ascending)
    indices: list[int] | None            # each node's index in onnxruntime's graph, where not the stored one
    reads: list[tuple[str, ...]]
    inputs: list[tuple[str, ...]]
    outputs: list[tuple[str, ...]]
    alias: list[bool]                    # output 0 is a view of input 0 (its record's view_opsets)
    in_place: list[tuple | None]         # the node's record's in_place rule
    activations: set[str]                # graph inputs and node outputs that are not weights
    planner_shapes: dict[str, TensorInfo]
    planner_keys: dict[str, tuple | None]
    opset: int
    count: Counter[str]                  # the planner's static reference counts (see planner.py)
    graph_inputs: list[str]
    graph_outputs: set[str]
    # What sizing needs, copied out: nodes with kernel scratch (by stored index), resident weight
    # bytes, and each Constant's output with its `value` size for when the table has none.
    scratch_nodes: list[tuple[int, onnx.NodeProto]]
    initializer_bytes: int
    constants: list[tuple[str, int | None]]
    body_scope: Scope = field(default_factory=Scope)  # what control-flow nodes take from the graph
    # The nodes walked are those onnxruntime runs: on the CPU provider, with the Casts it inserts
    # around float16 nodes (analysis/inserted_casts.py). `stored`: each one's index in graph.node
    # (None: an inserted Cast); `float_copies`: each float32 tensor those Casts add, with the
    # float16 tensor whose shape it has. Empty when it inserts none: node i is stored node i.
    stored: list[int | None] = field(default_factory=list)
    float_copies: dict[str, str] = field(default_factory=dict)
    runtime: WalkSetup | None = None        # onnxruntime's order
    explicit: WalkSetup | None = None       # the last order given (a scheduler's candidate)
    by_table: dict[int, tuple[ShapeTable, tuple]] = field(default_factory=dict)
    provider: str = "cpu"
    # The leaves of the function bodies onnxruntime inlines (inlined_bodies.py), which its order
    # starts from: (index in its graph, the walked nodes that write what the leaf reads); and the
    # stored positions of the nodes it inlines.
    leaves: tuple[tuple[int, tuple[int, ...]], ...] = ()
    inlined: tuple[int, ...] = ()

    def sized(self, shapes: ShapeTable) -> tuple[dict[str, int], dict[int, int], int, dict[int, int], tuple]:
        """The bytes of each activation whose size is known, the scratch of the nodes that have
        some (by stored index), the resident weights' bytes, the scratch of the variadic nodes
        whose output, written into a held buffer, changes theirs (by stored index), and the
        control-flow bodies' costs, at `shapes`: shared by every order."""
        held = self.by_table.get(id(shapes))
        if held is not None and held[0] is shapes:
            return held[1]
        tensors = shapes.tensors
        # Most tensors share a few shapes: each distinct (type, shape) is sized once.
        by_shape: dict[tuple, int | None] = {}
        known: dict[str, int] = {}
        for name in self.activations:
            info = tensors.get(name)
            if info is None:
                continue
            key = (info.elem_type, info.shape)
            size = by_shape.get(key, -1)
            if size == -1:
                size = by_shape[key] = info.nbytes()
            if size is not None:
                known[name] = size
        # the float32 copies, sized by their float16 tensors; a kernel run on them sizes its scratch by them
        rules = WithFloatCopies(shapes, self.float_copies) if self.float_copies else shapes
        known.update((copy, size) for copy in self.float_copies if (size := rules.nbytes(copy)) is not None)
        scratch = {stored: size for stored, node in self.scratch_nodes
                   if (size := workspace_bytes(node, rules, self.opset))}
        held_scratch = {stored: size for stored, node in self.scratch_nodes
                        if (size := held_workspace_bytes(node, rules, self.opset)) is not None
                        and size != scratch.get(stored, 0)}
        # A body's walk is its node's scratch; the outputs it sizes where the table could not.
        costs = [(stored, cost) for stored, node in self.scratch_nodes
                 if (domain_of(node), node.op_type) in CONTROL_FLOW_OPS
                 and (cost := body_cost(node, self.labels[stored], shapes, self.planner_shapes, self.opset,
                                        self.body_scope)) is not None]
        for stored, cost in costs:
            scratch[stored] = cost.scratch_bytes
            known.update((name, size) for name, size in cost.output_bytes.items() if name not in known)
        weight_bytes = self.initializer_bytes + sum(
            size or 0 for name, fallback in self.constants for size in [shapes.nbytes(name) or fallback])
        result = (known, scratch, weight_bytes, held_scratch, tuple(cost for _, cost in costs))
        self.by_table[id(shapes)] = (shapes, result)  # the table is held: its id stays its own
        return result


@dataclass
class WalkSetup:
    """One model in one execution order (`order`: stored indices by step): what its walks share
    at every shape table and every `absent`."""

    graph: WalkGraph
    order: list[int]
    labels: list[str]
    producer: dict[str, str]             # in order of birth: graph inputs, then by step
    last_read: dict[str, int]
    by_table: dict[int, tuple[ShapeTable, WalkSizes]] = field(default_factory=dict)
    # The buffer plan (planner.BufferPlan, made and kept by planner.buffer_plan) reads planner
    # shapes only, never sizes: one per `absent`, shared by every shape setting. The plain one is
    # kept; of the audit's growing `absent` sets, the last.
    plans: dict[frozenset[str], object] = field(default_factory=dict)

    def sized(self, shapes: ShapeTable) -> WalkSizes:
        held = self.by_table.get(id(shapes))
        if held is not None and held[0] is shapes:
            return held[1]
        known, scratch, weight_bytes, held_scratch, bodies = self.graph.sized(shapes)
        workspace = [0] * len(self.labels)
        if scratch:
            for step, stored in enumerate(self.order):
                workspace[step] = scratch.get(stored, 0)
        held_workspace = ({step: held_scratch[stored] for step, stored in enumerate(self.order)
                           if stored in held_scratch}
                          if held_scratch else {})
        unknown = () if len(known) == len(self.producer) else tuple(name for name in self.producer if name not in known)
        result = WalkSizes(known, unknown, workspace, weight_bytes, held_workspace, bodies)
        self.by_table[id(shapes)] = (shapes, result)  # the table is held: its id stays its own
        return result


# The last few models walked. A model is recognised by identity and by a fingerprint of its nodes
# and names (a model edited in place is set up again); its tables are immutable.
_GRAPHS: list[WalkGraph] = []
_GRAPHS_KEPT = 4


def walk_setup(model: onnx.ModelProto, symbolic_shapes: ShapeTable | None, extra_weights: Iterable[str],
               explicit: Sequence[int] | None = None, provider: str = "cpu") -> WalkSetup:
    """`model` prepared for walks in onnxruntime's order, or in `explicit` (stored indices by step;
    ValueError when not a topological order): from the cache when the same model was walked lately.
    `provider` "cpu": the nodes its CPU provider runs, with the Casts it inserts around float16
    nodes it has no float16 kernel for; "cuda": the nodes as stored."""
    # A list: indexing a protobuf repeated field builds a wrapper per access (35 us at 12k nodes).
    stored = list(model.graph.node)
    serialized = [node.SerializeToString() for node in stored]
    extra = frozenset(extra_weights)
    fingerprint = model_fingerprint(model, extra=extra, serialized=serialized)
    # An id is reused once its model is gone; the fingerprint then says whether the new model has
    # the same structure, for which the setup holds as well.
    graph = next((g for g in _GRAPHS if g.model_id == id(model) and g.symbolic is symbolic_shapes
                  and g.fingerprint == fingerprint and g.provider == provider), None)
    if graph is None:
        graph = _walk_graph(model, _nodes(stored, serialized), symbolic_shapes, extra, fingerprint, provider)
        _GRAPHS.insert(0, graph)
        del _GRAPHS[_GRAPHS_KEPT:]
    if explicit is None:
        if graph.runtime is None:
            graph.runtime = _ordered(graph, runtime_order_by_producers(graph.producers, graph.indices, graph.leaves))
        return graph.runtime
    wanted = (order_with_inserted(graph.stored, graph.inputs, graph.outputs, graph.reads, explicit)
              if graph.stored else list(explicit))
    if graph.explicit is None or graph.explicit.order != wanted:
        # a scheduler's candidate, judged at each shape setting in turn: the last one kept
        graph.explicit = _ordered(graph, checked_order(wanted, graph.producers, graph.labels))
    return graph.explicit


def _walk_graph(model: onnx.ModelProto, nodes: Sequence[_Node], symbolic_shapes: ShapeTable | None,
                extra: frozenset[str], fingerprint: bytes, provider: str) -> WalkGraph:
    graph = model.graph
    consumed = [node.consumed for node in nodes]
    outputs = [node.output for node in nodes]
    labels = [node.name or node_label(node, index) for index, node in enumerate(nodes)]  # a call only when unnamed
    producers = producers_of(outputs, consumed)
    if all(j < i for i, sources in enumerate(producers) for j in sources):
        order = list(range(len(nodes)))  # stored in order: what execution_order returns
    else:
        order = execution_order(graph, consumed, outputs)  # the one place that reports a cycle
    symbolic = symbolic_shapes if symbolic_shapes is not None else infer_shapes(model)
    weights = _weight_names(graph, nodes) | extra
    opset = _default_opset(model)
    bodies = _inlined_bodies(model, nodes, symbolic) if provider == "cpu" else InlinedBodies()
    # An inlined node and its body's leaves are numbered together, after every stored node and
    # before the inserted Casts. Only a node whose body has leaves is numbered so here: another
    # one the CPU inlines at float16 (Softmax-13) keeps its stored index, as the memory-truth runs
    # measured it (benchmarks/results/memory_truth_notes.md).
    leaf_counts = Counter(position for position, _ in bodies.leaves)
    indices, leaf_indices = runtime_numbering(
        [node.kind in FUNCTION_BODY_OPS or i in leaf_counts for i, node in enumerate(nodes)],
        [leaf_counts.get(i, 0) for i in range(len(nodes))])
    leaf_reads = [(index, names) for index, (_, names) in zip(leaf_indices, bodies.leaves)]
    stored_of: list[int | None] = []
    float_copies: dict[str, str] = {}
    plan = (_cpu_casts(nodes, indices, producers, symbolic, {vi.name for vi in graph.output}, opset, leaf_reads)
            if provider == "cpu" else None)
    planner = None
    if plan is not None:
        # A node's float32 output is not the float16 tensor the model declared: its shape is what
        # onnxruntime's inference makes of the node's inputs (_shapes_with_every_cast). Measured:
        # a float16 Gemma fused at batch 16 walked with each copy given its float16 tensor's
        # shape, 17.9 MiB; with the shapes inferred, 21.4; allocated 21.4.
        planner = _shapes_with_every_cast(model, plan, nodes, labels)
        # the graph onnxruntime runs: rewired stored nodes and the inserted Casts, by its indices
        nodes, labels, indices, stored_of = _cast_nodes(plan.steps, nodes, labels)
        float_copies = dict(plan.float_copies)
        consumed = [node.consumed for node in nodes]
        outputs = [node.output for node in nodes]
        producers = producers_of(outputs, consumed)
        order = runtime_order_by_producers(producers, indices)
    leaves = _leaves_by_producers(leaf_reads, outputs, float_copies)
    graph_inputs = [vi.name for vi in graph.input if vi.name and vi.name not in weights]
    activations = set(itertools.chain.from_iterable(outputs))
    activations -= weights
    activations.discard("")
    activations.update(graph_inputs)
    reads = [node.reads for node in nodes]
    if planner is None:
        # Planner shapes depend on the nodes, not on the order they run in (any topological order
        # propagates the same dims).
        planner = planner_shapes_in_order(model, [nodes[i] for i in order], symbolic)
    keys = planner_keys(activations, planner)
    kinds = [node.kind for node in nodes]
    graph_outputs = {vi.name for vi in graph.output}
    count = Counter(itertools.chain(graph_inputs, itertools.chain.from_iterable(reads),
                                    itertools.chain.from_iterable(outputs), graph_outputs))
    initializer_bytes = _initializer_bytes(graph.initializer) + sum(
        (_tensor_nbytes(t.values) or 0) + (_tensor_nbytes(t.indices) or 0) for t in graph.sparse_initializer)
    return WalkGraph(
        model_id=id(model), symbolic=symbolic_shapes, fingerprint=fingerprint, labels=labels,
        op_types=[node.op_type for node in nodes], producers=producers,
        indices=indices, reads=reads,
        inputs=[node.input for node in nodes], outputs=outputs,
        alias=[kind in VIEW_OPSETS and VIEW_OPSETS[kind][0] <= opset <= VIEW_OPSETS[kind][1] for kind in kinds],
        in_place=[IN_PLACE.get(kind) for kind in kinds], activations=activations, planner_shapes=planner,
        planner_keys=keys, opset=opset, count=count, graph_inputs=graph_inputs, graph_outputs=graph_outputs,
        scratch_nodes=[(i, _detached(node.proto)) for i, (kind, node) in enumerate(zip(kinds, nodes))
                       if kind in SCRATCH_OPS or kind in CONTROL_FLOW_OPS],
        body_scope=scope(graph, [node.proto for node in nodes if node.kind in CONTROL_FLOW_OPS]),
        initializer_bytes=initializer_bytes,
        constants=[(node.output[0], _constant_value_bytes(node.proto)) for node in nodes
                   if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS and node.output],
        stored=stored_of, float_copies=float_copies, provider=provider, leaves=leaves, inlined=bodies.inlined)


def _inlined_bodies(model: onnx.ModelProto, nodes: Sequence[_Node], symbolic: ShapeTable) -> InlinedBodies:
    """The nodes onnxruntime's CPU provider inlines, and their bodies' leaves (inlined_bodies.py):
    only a graph with a float16 tensor is probed."""
    elem_type = _float16_graph_types(symbolic)
    if elem_type is None:
        return InlinedBodies()

    def rank(name: str) -> int | None:
        info = symbolic.tensors.get(name)
        return None if info is None or info.shape is None else len(info.shape)

    return inlined_bodies([node.proto for node in nodes], elem_type, rank,
                          [(o.domain, o.version) for o in model.opset_import], model.ir_version)


def _float16_graph_types(symbolic: ShapeTable) -> Callable[[str], int | None] | None:
    """Each tensor's element type in `symbolic`; None where no tensor is float16 (the CPU provider
    then inserts no Cast and inlines no body at float16: nothing to replay or probe)."""
    tensors = symbolic.tensors
    if not any(info.elem_type == FLOAT16 for info in tensors.values()):
        return None

    def elem_type(name: str) -> int | None:
        info = tensors.get(name)
        return None if info is None else info.elem_type

    return elem_type


def _leaves_by_producers(leaf_reads: Sequence[tuple[int, Sequence[str]]], outputs: Sequence[Sequence[str]],
                         float_copies: Mapping[str, str] | None = None) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Each leaf as (its index, the positions of the walked nodes that write what it reads, in the
    order it reads them): a tensor, or where the replayed Casts left only its float32 copy
    (`float_copies`: copy -> source), the copy."""
    if not leaf_reads:
        return ()
    producer = {name: i for i, names in enumerate(outputs) for name in names if name}
    for copy, source in (float_copies or {}).items():
        if source not in producer and copy in producer:
            producer[source] = producer[copy]
    return tuple((index, tuple(dict.fromkeys(producer[n] for n in names if n in producer)))
                 for index, names in leaf_reads)


def _cpu_casts(nodes: Sequence[_Node], indices: list[int] | None, producers: Sequence[Sequence[int]],
               symbolic: ShapeTable, graph_outputs: set[str], opset: int,
               leaf_reads: Sequence[tuple[int, Sequence[str]]] = ()):
    """The CPU provider's inserted Casts (analysis/inserted_casts.py), None where it inserts none:
    only a graph with a float16 tensor is replayed."""
    elem_type = _float16_graph_types(symbolic)
    if elem_type is None:
        return None
    steps = [Step(node.op_type, node.domain, list(node.input), list(node.output),
                  i if indices is None else indices[i], i, node.name,
                  implicit=tuple(name for name in node.reads if name not in node.input))
             for i, node in enumerate(nodes)]
    leaves = _leaves_by_producers(leaf_reads, [node.output for node in nodes])

    def order(steps: list[Step]) -> list[int]:
        return runtime_order_by_producers(producers, [step.index for step in steps], leaves)

    return inserted_casts(steps, elem_type, graph_outputs, opset,
                          lambda step: nodes[step.stored].kind in CONTROL_FLOW_OPS, order,
                          numbered_after=max((index for index, _ in leaf_reads), default=None))


def _cast_nodes(steps: Sequence[Step], nodes: Sequence[_Node], labels: Sequence[str]):
    """The walk's nodes, labels, onnxruntime indices and stored indices from a CastPlan's steps: a
    stored node rewired to float32 copies gets a proto of its own with them (what its scratch reads)."""
    walked, walked_labels, indices, stored_of = [], [], [], []
    for step in steps:
        if step.stored is None:
            proto = onnx.helper.make_node("Cast", step.inputs, step.outputs, name=step.name, to=step.to)
            node, label = _Node(proto, _fields(proto)), step.name
        else:
            original = nodes[step.stored]
            node, label = original, labels[step.stored]
            if list(original.input) != step.inputs or list(original.output) != step.outputs:
                proto = onnx.NodeProto()
                proto.CopyFrom(original.proto)
                del proto.input[:], proto.output[:]
                proto.input.extend(step.inputs)
                proto.output.extend(step.outputs)
                node = _Node(proto, _fields(proto))
        walked.append(node)
        walked_labels.append(label)
        indices.append(step.index)
        stored_of.append(step.stored)
    return walked, walked_labels, indices, stored_of


def _shapes_with_every_cast(model: onnx.ModelProto, plan: CastPlan, nodes: Sequence[_Node],
                            labels: Sequence[str]) -> dict[str, TensorInfo]:
    """The planner's shapes of the graph onnxruntime runs (`plan`'s steps), as it shapes them.

    onnxruntime creates each float32 copy with a type and no shape, and shapes it in the Resolve
    that follows the inserted Casts, on the graph where every one of them still stands
    (insert_cast_transformer.cc): a node run in float32 reads the Cast of each float16 input,
    which has that tensor's shape as declared and inferred at load. Only then are the Casts that
    cancel removed (a node then reads its producer's float32 output directly), and the next
    Resolve merges its inference into the shapes the tensors have (graph.cc MergeShapeInfo,
    onnx's mergeInShapeInfo): an input it reads now carries no more than the one it read before,
    the float16 tensor's shape being that output's merged with the declaration, so nothing
    changes and every tensor of the graph it runs keeps the first Resolve's shape. A chain of
    float32 nodes thus keeps the dims each float16 tensor between them declared: a copy of a
    Reshape to a computed shape is [?, ?, 128] by inference, the declared tensor behind it
    [batch, sequence, 128], and an Add of the two [batch, sequence, 128]. Measured on float16
    GPT-2 (dynamo) at batch 8 x 128 tokens, inferred on the graph it runs only: 16.6 MiB against
    21.6 allocated; every NodeArg of its ORT-format save had these shapes."""
    inserted, _, indices, _ = _cast_nodes(plan.inserted, nodes, labels)
    producers = producers_of([node.output for node in inserted], [node.consumed for node in inserted])
    order = runtime_order_by_producers(producers, indices)
    first = _runs_as(model, inserted)
    return planner_shapes_in_order(first, [inserted[i] for i in order], infer_shapes(first))


def _runs_as(model: onnx.ModelProto, nodes: Sequence[_Node]) -> onnx.ModelProto:
    """A light copy of `model` (no big weights: what shape inference reads) whose nodes are
    `nodes` (_cast_nodes gives each rewired one a proto of its own)."""
    runs = inference_copy(model)
    del runs.graph.node[:]
    runs.graph.node.extend(node.proto for node in nodes)
    return runs


def _fields(proto: onnx.NodeProto) -> tuple:
    """_Node's fields of a node with no subgraph (an inserted Cast, a stored node rewired to them)."""
    inputs = tuple(proto.input)
    reads = tuple(name for name in inputs if name)
    kind = ("" if proto.domain in _DEFAULT_DOMAINS else proto.domain, proto.op_type)
    return (proto.name, proto.op_type, proto.domain, inputs, tuple(proto.output), tuple(set(reads)), reads, kind)


class _Node:
    """A node's fields, read from the protobuf once (see _nodes); attributes are read from `proto`
    (rarely: Concat's axis, scratch sizes), which is never kept past the setup."""

    __slots__ = ("proto", "name", "op_type", "domain", "input", "output", "consumed", "reads", "kind")

    def __init__(self, proto: onnx.NodeProto, fields: tuple):
        self.proto = proto
        self.name, self.op_type, self.domain, self.input, self.output, self.consumed, self.reads, self.kind = fields

    @property
    def attribute(self):
        return self.proto.attribute


# Each field read of a protobuf node builds a new wrapper (12k nodes: 4 ms a field, 20 ms a node's
# fields), while serializing a node takes 0.2 us: the fields of the nodes seen lately, by their
# bytes (a candidate keeps most of the original's nodes as they were). Never a node's attributes.
_NODE_FIELDS: dict[bytes, tuple] = {}
_NODE_FIELDS_KEPT = 200_000


def _nodes(stored: Sequence[onnx.NodeProto], serialized: Sequence[bytes]) -> list[_Node]:
    if len(_NODE_FIELDS) > _NODE_FIELDS_KEPT:
        _NODE_FIELDS.clear()
    nodes = []
    for proto, key in zip(stored, serialized):
        fields = _NODE_FIELDS.get(key)
        if fields is None:
            # tuples: of strings only, the garbage collector stops tracking them after one look
            inputs, op_type, domain = tuple(proto.input), proto.op_type, proto.domain
            explicit = tuple(name for name in inputs if name) if "" in inputs else inputs
            if may_hold_subgraphs(op_type, domain):
                consumed = consumed_names(proto)
                reads = tuple(_reads(inputs, consumed))
            else:  # its inputs, read once (a field read builds a wrapper)
                consumed, reads = set(explicit), explicit
            kind = ("" if domain in _DEFAULT_DOMAINS else domain, op_type)  # (domain_of, op_type)
            fields = _NODE_FIELDS[key] = (proto.name, op_type, domain, inputs, tuple(proto.output),
                                          tuple(consumed), reads, kind)
        nodes.append(_Node(proto, fields))
    return nodes


def _ordered(graph: WalkGraph, order: list[int]) -> WalkSetup:
    labels = [graph.labels[i] for i in order]
    producer = dict.fromkeys(graph.graph_inputs, INPUT_PRODUCER)
    activations = graph.activations
    for i, label in zip(order, labels):
        for name in graph.outputs[i]:
            if name in activations:
                producer[name] = label
    last_read = {name: step for step, i in enumerate(order) for name in graph.reads[i]}
    return WalkSetup(graph, order, labels, producer, last_read)



def weight_names(graph: onnx.GraphProto) -> set[str]:
    """Initializers and Constant outputs: resident, never counted as activations."""
    return _weight_names(graph)


def _reads(inputs: Sequence[str], consumed: set[str]) -> list[str]:
    """What the planner counts as a node's reads: each explicit input occurrence, then each name
    its subgraphs take from the enclosing scope (`consumed` less the explicit inputs)."""
    explicit = [name for name in inputs if name]
    return explicit + sorted(consumed - set(explicit))


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 0)


def _weight_names(graph: onnx.GraphProto, nodes: Iterable[onnx.NodeProto | _Node] | None = None) -> set[str]:
    names = {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    for node in graph.node if nodes is None else nodes:
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            names.update(name for name in node.output if name)
    return names


def _constant_value_bytes(node: onnx.NodeProto) -> int | None:
    """A Constant's size from its `value` tensor (resident weights count initializers by their own
    dims and Constant outputs by the shape table, else by this)."""
    value = next((a.t for a in node.attribute if a.name == "value"), None)
    return _tensor_nbytes(value) if value is not None else None


def _detached(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _initializer_bytes(initializers: Iterable[onnx.TensorProto]) -> int:
    """The initializers' bytes (unknown ones as 0), each distinct (type, dims) sized once."""
    counts = Counter((t.data_type, tuple(t.dims)) for t in initializers)
    return sum(count * (TensorInfo("", data_type, dims).nbytes() or 0) for (data_type, dims), count in counts.items())


def _tensor_nbytes(tensor: onnx.TensorProto) -> int | None:
    return TensorInfo(tensor.name, tensor.data_type, tuple(tensor.dims)).nbytes()
