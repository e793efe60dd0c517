"""Execution order of a graph's nodes, and what each node reads (subgraph reads included); the
one topological sort (Kahn) that graph/edit.py's graphsurgeon sort uses too.

Shared by shape inference (onnx infers nodes in stored order and never revisits one whose input
was not inferred yet) and by the liveness walk.

onnxruntime's default execution order (`runtime_order`) is not the stored one: a reverse
depth-first walk from the nodes no node reads, emitting each node after its producers and
visiting a node's producers highest stored index first (GraphViewer's constructor and
Graph::ReverseDFSFrom with NodeCompare, onnxruntime/core/graph/graph_viewer.cc and graph.cc).
Of two independent branches the one stored later runs first: the transformer sample computes
keys before queries, and values only after the softmax. The indices compared are those of
onnxruntime's graph, where a node it runs as its function body comes after every stored node
(`runtime_indices`).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Sequence

import onnx


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The node's name, or `op_type#index` (index in the stored node list) when it has none."""
    return node.name or f"{node.op_type}#{index}"


def execution_order(graph: onnx.GraphProto, consumed: Sequence[Iterable[str]] | None = None,
                    outputs: Sequence[Sequence[str]] | None = None) -> list[int]:
    """Indices into `graph.node` in an order that respects data dependencies.

    The stored order when it is already topological (the ONNX requirement, and the order a
    runtime follows); otherwise Kahn's algorithm, iterative because graphs reach 10k+ nodes,
    taking the lowest stored index among ready nodes so the result stays close to the file.
    Raises ValueError on a cycle. `consumed`: each node's consumed_names, and `outputs` each one's
    outputs, when the caller has them (each read of a protobuf field builds a wrapper).
    """
    nodes = graph.node
    if consumed is None:
        consumed = [consumed_names(node) for node in nodes]
    if outputs is None:
        outputs = [node.output for node in nodes]
    producer = {name: i for i, names in enumerate(outputs) for name in names if name}
    if all(producer.get(name, -1) < i for i, names in enumerate(consumed) for name in names):
        return list(range(len(nodes)))

    edges = ((producer[name], i) for i, names in enumerate(consumed) for name in names if name in producer)
    order, stuck = topological(len(nodes), edges)
    if stuck:
        names = [node_label(nodes[i], i) for i in stuck]
        raise ValueError(f"the graph has a cycle through {', '.join(names[:5])}")
    return order


def runtime_order(graph: onnx.GraphProto) -> list[int]:
    """Indices into `graph.node` in onnxruntime's default execution order (see the module
    docstring). Iterative: graphs reach 10k+ nodes. Assumes an acyclic graph."""
    return runtime_order_by_producers(
        producers_of([node.output for node in graph.node], [consumed_names(node) for node in graph.node]))


def runtime_order_of(nodes: Sequence[onnx.NodeProto], consumed: Sequence[set[str]]) -> list[int]:
    """onnxruntime's order of `nodes` stored as listed (each node's consumed_names given): what a
    scheduler's candidate stored order would run as."""
    return runtime_order_by_producers(producers_of([node.output for node in nodes], consumed))


def producers_of(outputs: Sequence[Sequence[str]], consumed: Sequence[Iterable[str]]) -> list[tuple[int, ...]]:
    """Each node's producers, ascending, from each one's outputs and consumed_names."""
    producer = {name: i for i, names in enumerate(outputs) for name in names if name}
    return [tuple(sorted({producer[n] for n in names if n in producer})) for names in consumed]


def runtime_order_by_producers(producers: Sequence[Sequence[int]], indices: Sequence[int] | None = None,
                               leaves: Sequence[tuple[int, Sequence[int]]] = ()) -> list[int]:
    """onnxruntime's order of nodes given as each one's producers (`producers_of`). `indices`:
    each node's index in onnxruntime's graph where some differ from the stored ones
    (`runtime_indices`): the walk compares those. `leaves`: nodes of onnxruntime's graph that are
    not walked, whose outputs nothing reads (an inlined function body's: analysis/inlined_bodies.py),
    as (index, producers in the order the leaf's walk reaches them): the order starts from them
    as from any leaf, and they are left out of it."""
    count = len(producers)
    if indices is not None:
        producers = [sorted(sources, key=indices.__getitem__) for sources in producers]
    # Pushed in order, popped last first: a node's producers ascending, a leaf's as it reaches them reversed
    producers = [*producers, *(list(reversed(sources)) for _, sources in leaves)]
    read = [False] * len(producers)
    for sources in producers:
        for i in sources:
            read[i] = True
    if indices is not None or leaves:
        index = [*(indices if indices is not None else range(count)), *(i for i, _ in leaves)]
        by_index = sorted(range(len(producers)), key=index.__getitem__)
    else:
        by_index = range(count)
    stack = [(i, False) for i in by_index if not read[i]]
    visited = [False] * len(producers)
    order: list[int] = []
    while stack:
        i, leaving = stack.pop()
        if leaving:
            if i < count:
                order.append(i)
        elif not visited[i]:
            visited[i] = True
            stack.append((i, True))
            # Pushed in ascending index order, so the highest-index producer is visited first.
            stack.extend((j, False) for j in producers[i] if not visited[j])
    return order


def runtime_indices(expanded: Sequence[bool]) -> list[int] | None:
    """Each node's index in onnxruntime's graph, from which nodes it replaces by their function
    body (`expanded`: an operator its provider has no kernel for, such as HardSwish on the CPU);
    None when it replaces none, so the indices are the stored ones.

    onnxruntime's graph numbers nodes as stored (Constant nodes become initializers, which keeps
    the others' relative order), then, partitioning, inlines each expanded node in stored order:
    its body's nodes are appended after every node there is. An expanded node therefore compares
    above every stored one, and of a node's producers it is visited first: measured on
    onnxruntime 1.31.1's profile of timm's LeViT, whose MatMul reading a HardSwish runs its
    Transpose(weight) right before it, while one reading an Add runs that Transpose before the
    whole network below it."""
    return runtime_numbering(expanded)[0]


def runtime_numbering(expanded: Sequence[bool], leaf_counts: Sequence[int] = ()) -> tuple[list[int] | None, list[int]]:
    """runtime_indices, and the indices of the leaves each expanded node's body adds
    (`leaf_counts`, per node: analysis/inlined_bodies.py): a body's nodes are numbered together
    when its node is inlined, the nodes of one body above those of the bodies inlined before."""
    if not any(expanded):
        return None, []
    count = len(expanded)
    indices: list[int] = []
    leaves: list[int] = []
    next_index = count
    for i, is_expanded in enumerate(expanded):
        if not is_expanded:
            indices.append(i)
            continue
        indices.append(next_index)
        added = leaf_counts[i] if i < len(leaf_counts) else 0
        leaves.extend(range(next_index + 1, next_index + 1 + added))
        next_index += 1 + added
    return indices, leaves


def checked_order(order: Sequence[int], producers: Sequence[Sequence[int]], labels: Sequence[str]) -> list[int]:
    """`order` when it runs every node once, each after its producers; else ValueError."""
    order = list(order)
    if sorted(order) != list(range(len(producers))):
        raise ValueError("the order must name every node exactly once")
    done = [False] * len(producers)
    for i in order:
        if any(not done[j] for j in producers[i]):
            raise ValueError(f"{labels[i]} runs before one of its producers")
        done[i] = True
    return order


def topological(count: int, edges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm over items 0..count-1, an edge (a, b) putting a before b, the lowest index
    first among the ready ones (so a sorted input keeps its order). Iterative: graphs reach 10k+
    nodes. Returns (order, the items a cycle left unplaced)."""
    dependents: list[set[int]] = [set() for _ in range(count)]
    for a, b in edges:
        if a != b:
            dependents[a].add(b)
    pending = [0] * count
    for targets in dependents:
        for b in targets:
            pending[b] += 1
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in dependents[i]:
            pending[k] -= 1
            if pending[k] == 0:
                heapq.heappush(ready, k)
    return order, [i for i, n in enumerate(pending) if n]


def consumed_names(node: onnx.NodeProto) -> set[str]:
    """Names a node reads: its inputs plus what its subgraphs read from the enclosing scope
    (an If branch that uses `x` keeps `x` alive until the If runs)."""
    names = set(node.input)
    names.discard("")
    if may_hold_subgraphs(node.op_type, node.domain) and node.attribute:
        for graph in _subgraphs(node):
            names |= outer_references(graph)
    return names


def may_hold_subgraphs(op_type: str, domain: str) -> bool:
    """Only control flow (and custom operators) holds subgraphs: for the rest a node reads its
    inputs and nothing else, and the attribute scan is skipped (2k Conv/Gemm-like nodes with
    attributes cost 40 ms a walk at 12k nodes)."""
    return op_type in _CONTROL_FLOW or domain not in ("", "ai.onnx")


_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def _subgraphs(node: onnx.NodeProto) -> Sequence[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            graphs.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attr.graphs)
    return graphs


def outer_references(graph: onnx.GraphProto) -> set[str]:
    """Names used in `graph` (and graphs nested in it) that it does not define itself. ONNX
    forbids shadowing, so set difference is exact. Recursion depth is the nesting depth."""
    defined = {vi.name for vi in graph.input}
    defined |= {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    used = {vi.name for vi in graph.output}
    for node in graph.node:
        defined.update(node.output)
        used |= consumed_names(node)
    return used - defined - {""}


def model_fingerprint(model: onnx.ModelProto, nodes: Iterable[onnx.NodeProto] | None = None, extra: Iterable[str] = (),
                      serialized: Iterable[bytes] | None = None, *, declared: bool = True) -> bytes:
    """A digest of a model's structure: nodes (serialized, 3 ms at 12k nodes; `serialized`: each
    node's SerializeToString(), when the caller has them), graph inputs, outputs, value_info,
    initializers' names, types and dims (not their payloads) and opsets, plus `extra` names.
    Caches of per-model work compare it to notice a model edited in place. `declared` False
    leaves value_info out (a cache that takes it from the model each time)."""
    graph = model.graph
    digest = hashlib.blake2b(digest_size=16)
    if serialized is None:
        serialized = (node.SerializeToString() for node in (graph.node if nodes is None else nodes))
    digest.update(b"".join(serialized))
    for part in (graph.input, graph.output, *((graph.value_info,) if declared else ()), model.opset_import):
        digest.update(b"".join(item.SerializeToString() for item in part))
    # Initializers by name, type and dims: never their payloads (each field read apart: a third
    # cheaper than a tuple per initializer at 4k initializers).
    initializers = graph.initializer
    digest.update("\0".join([t.name for t in initializers]).encode())
    digest.update(repr([t.data_type for t in initializers]).encode())
    digest.update(repr([t.dims for t in initializers]).encode())
    digest.update("\0".join(sorted(extra)).encode())
    return digest.digest()
