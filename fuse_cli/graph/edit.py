"""The graph-editing primitives every pass shares: constness, the one safety check, the splice.

Passes never touch `graph.nodes` directly. They return replacement nodes; `GraphEditor.apply`
detaches what was matched, records the replacement to be placed where the matched root stood
(so the node list stays topologically ordered without re-sorting), and accounts the removed
intermediates. The node list is rebuilt once per sweep by `commit`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.core.order import topological
from fuse_cli.errors import FuseError
from fuse_cli.graph.values import constant_value, is_missing
from fuse_cli.graph.weights import MappedValues, ParkingLot


class Match(Protocol):
    """What the safety check reads of a match (fuse_cli.match.Match is one; the graph layer does not
    import the matcher above it): the root, every node covered, root first, the captured tensors,
    and the (capture name, consumer) of each the pattern wants constant."""

    root: gs.Node
    covered: list[gs.Node]
    tensors: dict[str, gs.Tensor | None]
    const_vars: list[tuple[str, gs.Node]]


@dataclass
class Replacement:
    """What a rewrite puts in place of a match.

    `nodes` must produce every output of the matched root (same tensor objects, so consumers and
    graph outputs keep their names). `reroute` instead pairs a root output with an existing tensor
    that already carries the same value (used by eliminations: Identity, Dropout, x*1). Pairs,
    not a dict: graphsurgeon tensors define __eq__ and are unhashable.
    """

    nodes: list[gs.Node] = field(default_factory=list)
    reroute: list[tuple[gs.Tensor, gs.Tensor]] = field(default_factory=list)


def kept(node: gs.Node) -> gs.Node:
    """A matched node as it is, for a replacement that keeps it: `GraphEditor.apply` detaches
    every covered node, so the replacement carries a copy (same name, attributes and tensors)."""
    return rebuilt(node)


def rebuilt(node: gs.Node, *, inputs: Sequence[gs.Tensor] | None = None, outputs: Sequence[gs.Tensor] | None = None,
            attrs: Mapping[str, object] | None = None) -> gs.Node:
    """A matched node again, under its own name, op and domain, with the inputs, outputs or
    attributes given (its own where not): a rewrite that changes a node rather than adding one."""
    return gs.Node(node.op, node.name, dict(node.attrs if attrs is None else attrs),
                   list(node.inputs if inputs is None else inputs), list(node.outputs if outputs is None else outputs),
                   domain=node.domain)


@dataclass(frozen=True)
class TensorShape:
    """What the checks may rely on: dims that hold for every input shape (ints), symbolic names,
    or None for unknown. Checks must never depend on dims a user bound for the memory estimate."""

    dims: tuple[int | str | None, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def static(self, axis: int) -> int | None:
        dim = self.dims[axis]
        return dim if isinstance(dim, int) else None


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... : the first not in `taken`, which it joins."""
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


class GraphEditor:
    """Owns one gs.Graph for the length of a pipeline run."""

    def __init__(self, graph: gs.Graph, *, opset: int, shapes: Mapping[str, tuple | None],
                 dtypes: Mapping[str, int], input_defaults: Iterable[str] = (),
                 fold_limit_bytes: int = 64 * 2**20, target: str = "onnx", lot: ParkingLot | None = None,
                 names: set[str] | None = None, enclosed: bool = False):
        """names: the names already taken, shared by the editors of one model's graphs, so a name
        made in one body is never one another scope declares (no capture, no shadowing). enclosed:
        `graph` is an If/Loop/Scan body, whose patterns may reach the enclosing graph's nodes
        through the outer tensors it reads; those nodes are never part of a match here."""
        self.graph = graph
        self.lot = lot
        self.opset = opset
        self.target = target
        self.fold_limit_bytes = fold_limit_bytes
        self._shapes = shapes
        self._dtypes = dtypes
        self.input_defaults = frozenset(input_defaults)
        self._names = names if names is not None else model_names(graph)
        self._members: set[int] | None = {id(n) for n in graph.nodes} if enclosed else None
        self._replacements: dict[int, list[gs.Node]] = {}
        self._removed: set[int] = set()
        self.graph_outputs: set[int] = {id(t) for t in graph.outputs}

    # ---- facts about tensors -------------------------------------------------------------
    def shape(self, tensor: gs.Tensor | None) -> TensorShape | None:
        if tensor is None:
            return None
        if isinstance(tensor, gs.Constant):
            return TensorShape(tuple(int(d) for d in tensor.shape))
        dims = tensor.shape if tensor.shape is not None else self._shapes.get(tensor.name)
        if dims is None:
            return None
        return TensorShape(tuple(d if isinstance(d, (int, str)) and d != -1 else None for d in dims))

    def dim(self, tensor: gs.Tensor | None, axis: int) -> int | str | None:
        """Dim `axis` of `tensor` as shape() knows it; None when unknown or out of range."""
        shape = self.shape(tensor)
        return shape.dims[axis] if shape is not None and 0 <= axis < shape.rank else None

    def dtype(self, tensor: gs.Tensor | None) -> np.dtype | None:
        if tensor is None:
            return None
        if isinstance(tensor, gs.Constant):
            # Not .values, which would read a lazily loaded weight; graphsurgeon knows the dtype
            # without loading, except for types numpy lacks (bfloat16, float8: an onnx enum).
            return tensor.values.dtype if isinstance(tensor.dtype, int) else np.dtype(tensor.dtype)
        if tensor.dtype is not None:
            return np.dtype(tensor.dtype) if not isinstance(tensor.dtype, int) else _np_dtype(tensor.dtype)
        elem = self._dtypes.get(tensor.name)
        return _np_dtype(elem) if elem else None

    def is_graph_output(self, tensor: gs.Tensor) -> bool:
        return id(tensor) in self.graph_outputs

    def not_constant_reason(self, tensor: gs.Tensor | None, role: str, node: gs.Node) -> str | None:
        """None if `tensor` is a constant, else why not, with the hint a user needs."""
        # An initializer is a constant without reading its values (a weight may be loaded lazily).
        if tensor is None or isinstance(tensor, gs.Constant) or constant_value(tensor) is not None:
            return None
        where = f"{label(node)}'s {role} {tensor.name!r}"
        if tensor.name in self.input_defaults:
            return (f"{where} is a graph input with a default initializer (callers may override it): "
                    "pass --freeze-inputs to treat it as a constant")
        if not tensor.inputs:
            return f"{where} is a graph input, not a constant"
        return f"{where} is computed at run time by {label(tensor.inputs[0])}"

    # ---- the one safety check ------------------------------------------------------------
    def replace_reason(self, m: Match, kept: Iterable[gs.Node] = ()) -> str | None:
        """May the matched nodes be replaced? Every intermediate (an output of a non-root node)
        must be read only inside the match and must not be a graph output; constants must be
        constants. A reader whose results flow only into the match (a Shape that computes a
        matched Reshape's shape) dies with it and counts as inside. `kept` nodes are exempt: the
        rewrite promises to produce their outputs too (e.g. SkipLayerNormalization's optional sum
        output). Returns None or the reason."""
        exempt = {id(n) for n in kept}
        outer = next((n for n in m.covered if not self._in_scope(n)), None)
        if outer is not None:
            return f"{label(outer)} belongs to the graph enclosing this subgraph"
        for node in m.covered:
            if node is m.root or id(node) in exempt:
                continue
            for out in node.outputs:
                if self.is_graph_output(out):
                    return f"{label(node)}'s output {out.name!r} is a graph output"
                readers = self.outside_readers(out, m)
                if readers:
                    return f"{label(node)}'s output {out.name!r} is also read by {label(readers[0])}"
        for var_name, consumer in m.const_vars:
            reason = self.not_constant_reason(m.tensors[var_name], var_name, consumer)
            if reason:
                return reason
        return None

    def _in_scope(self, node: gs.Node) -> bool:
        """Is `node` one of this editor's graph (always, for the main graph)? The set is renewed
        when a node is not in it: a whole-graph pass may have changed the node list."""
        if self._members is None or id(node) in self._members:
            return True
        self._members = {id(n) for n in self.graph.nodes}
        self._members.update(id(n) for nodes in self._replacements.values() for n in nodes)
        return id(node) in self._members

    def outside_readers(self, t: gs.Tensor, m: Match) -> list[gs.Node]:
        """The nodes that read `t` outside the match, less those whose results flow only into the
        match (a Shape computing a matched Reshape's shape dies with it: inside)."""
        covered = {id(n) for n in m.covered}
        return [r for r in t.outputs if id(r) not in covered and not self._feeds_only(r, covered)]

    def _feeds_only(self, node: gs.Node, covered: set[int], limit: int = 32) -> bool:
        """Do all of `node`'s results end as the shape input of covered Reshapes or Expands
        (through at most `limit` other nodes)? Then they die with the match; a result a rewrite
        could still read (a mask, a bias) would not."""
        seen, stack = {id(node)}, [node]
        while stack:
            current = stack.pop()
            for out in current.outputs:
                if self.is_graph_output(out):
                    return False
                for reader in out.outputs:
                    if id(reader) in covered:
                        if reader.op not in ("Reshape", "Expand") or reader.inputs[1] is not out:
                            return False
                        continue
                    if id(reader) in seen:
                        continue
                    if len(seen) >= limit:
                        return False
                    seen.add(id(reader))
                    stack.append(reader)
        return True

    def reroute_reason(self, old: gs.Tensor, new: gs.Tensor) -> str | None:
        """Can every reader of `old` read `new` instead? Only a problem when `old` is a graph
        output: its name must survive, so `new` takes that name, which needs `new` to be a
        node output that is not itself a graph output."""
        if not self.is_graph_output(old):
            return None
        if not isinstance(new, gs.Variable) or not new.inputs:
            return f"{old.name!r} is a graph output fed directly by {new.name!r}, which is a graph input or constant"
        if not self._in_scope(new.inputs[0]):
            return (f"{old.name!r} is a body output and {new.name!r} comes from the enclosing graph "
                    "(a body returns its own values)")
        if self.is_graph_output(new):
            return f"both {old.name!r} and {new.name!r} are graph outputs"
        return None

    # ---- building and splicing -----------------------------------------------------------
    def unique_name(self, base: str) -> str:
        return unique_name(base, self._names)

    def constant(self, base: str, values: np.ndarray) -> gs.Constant:
        # np.ascontiguousarray returns at least 1-D: a 0-d scalar would gain a rank (and broadcast
        # a scalar chain to [1], wrong for a rank-0 output)
        values = np.asarray(values)
        name = self.unique_name(base)
        return gs.Constant(name, self.hold(name, np.ascontiguousarray(values).reshape(values.shape)))

    def hold(self, name: str, values: np.ndarray) -> np.ndarray | MappedValues:
        """A new weight as the graph should hold it: a big one parked in the run's lot at once and
        held by reference (graph/weights.py), so a pass that rewrites every weight never holds
        them all, and graphsurgeon's folder, which keeps arrays it was handed, never sees one."""
        return values if self.lot is None else self.lot.hold(name, values)

    def variable(self, base: str, like: gs.Tensor | None = None) -> gs.Variable:
        dtype = self.dtype(like) if like is not None else None
        return gs.Variable(self.unique_name(base), dtype=dtype)

    def node(self, op: str, inputs: Sequence[gs.Tensor], attrs: Mapping[str, object] | None = None, *, name: str,
             outputs: Sequence[gs.Tensor] | int = 1, domain: str = "") -> gs.Node:
        """A new node: named `name` made unique in the model; reading `inputs` less trailing
        omitted ones (an optional input left out is never written as a trailing ""); writing
        `outputs`, the tensors given (a matched root's, so its readers and graph outputs keep their
        names) or that many new variables named after the node."""
        inputs = list(inputs)
        while inputs and is_missing(inputs[-1]):
            inputs.pop()
        name = self.unique_name(name)
        if isinstance(outputs, int):
            outputs = [self.variable(f"{name}_out") for _ in range(outputs)]
        return gs.Node(op=op, name=name, domain=domain, attrs=dict(attrs or {}), inputs=inputs, outputs=list(outputs))

    def builder(self, base: str) -> NodeBuilder:
        """A node builder for one replacement, its nodes named after `base`."""
        return NodeBuilder(self, base)

    def is_removed(self, node: gs.Node) -> bool:
        return id(node) in self._removed

    def apply(self, m: Match, replacement: Replacement) -> list[str]:
        """Splice `replacement` in for the match; returns the names of the removed intermediates."""
        still_made = {id(t) for node in replacement.nodes for t in node.outputs}
        removed = [out.name for n in m.covered if n is not m.root for out in n.outputs if id(out) not in still_made]
        for old, new in replacement.reroute:
            # A graph output keeps its name: `new` takes it, so the name that vanishes is new's.
            removed.append(new.name if self.is_graph_output(old) else old.name)
            self._reroute(old, new)
        for node in m.covered:
            _detach_inputs(node)
            node.outputs.clear()
            self._removed.add(id(node))
        self._replacements[id(m.root)] = replacement.nodes
        if self._members is not None:
            self._members.update(id(n) for n in replacement.nodes)
        return removed

    def _reroute(self, old: gs.Tensor, new: gs.Tensor) -> None:
        for consumer in list(old.outputs):
            for i, tensor in enumerate(consumer.inputs):
                if tensor is old:
                    consumer.inputs[i] = new
        if self.is_graph_output(old):
            index = next(i for i, t in enumerate(self.graph.outputs) if t is old)
            new.name, old.name = old.name, old.name + "__replaced"
            new.dtype, new.shape = old.dtype or new.dtype, old.shape or new.shape
            self.graph.outputs[index] = new
            self.graph_outputs = {id(t) for t in self.graph.outputs}

    def commit(self) -> list[tuple[str, list[str]]]:
        """Rebuild the node list once: replacements stand where their root stood. Returns the
        nodes the rewrites left without readers and dropped, (name, output names) each."""
        if not self._replacements and not self._removed:
            return []
        nodes: list[gs.Node] = []
        for node in self.graph.nodes:
            if id(node) in self._replacements:
                # a replacement that a later match of the same sweep consumed is gone as well
                nodes.extend(n for n in self._replacements[id(node)] if id(n) not in self._removed)
            elif id(node) not in self._removed:
                nodes.append(node)
        self.graph.nodes, dropped = self._without_dead_nodes(nodes)
        self._replacements.clear()
        self._removed.clear()
        return dropped

    def _without_dead_nodes(self, nodes: list[gs.Node]) -> tuple[list[gs.Node], list[tuple[str, list[str]]]]:
        """Drop nodes whose outputs nobody reads any more (transitively: last node first), so the
        Shape chain a rewrite made useless stops counting as a reader for the next pass of the
        same round. ONNX nodes have no side effects; the final cleanup would drop them anyway."""
        alive: list[gs.Node] = []
        dropped: list[tuple[str, list[str]]] = []
        for node in reversed(nodes):
            if node.outputs and all(not t.outputs and not self.is_graph_output(t) for t in node.outputs):
                dropped.append((node.name or node.op, [t.name for t in node.outputs]))
                _detach_inputs(node)
                node.outputs.clear()
                continue
            alive.append(node)
        alive.reverse()
        return alive, dropped


def _detach_inputs(node: gs.Node) -> None:
    """node.inputs.clear(), without its cost on shared tensors: graphsurgeon removes the node from
    each input's consumer list with list.remove, comparing nodes by value (Node.__eq__ compares
    attributes and tensors) all along the list, so detaching readers of a constant that 500
    nodes read (a LayerNorm epsilon) was quadratic. Here: by identity, in plain list operations."""
    for tensor in node.inputs:
        readers = tensor.outputs
        index = next((i for i, reader in enumerate(readers) if reader is node), None)
        if index is not None:
            list.__delitem__(readers, index)
    list.clear(node.inputs)


class NodeBuilder:
    """A replacement's nodes, one call each, as onnxscript's rewriter builds them: `b.op.Where(c, x, y)`
    makes a Where named `{base}_where` (unique in the model), gives it a new output, records it in
    `b.nodes` and returns the output to wire into the next call. Attributes are keywords;
    `_domain`, `_outputs` (existing tensors to write: a matched root's) and `_name` are the node's.
    The engine records every node of the replacement as the pass's (FusionRecord.created)."""

    def __init__(self, editor: GraphEditor, base: str):
        self._editor = editor
        self._base = base
        self.nodes: list[gs.Node] = []
        self.op = _Ops(self)

    def add(self, op: str, inputs: Sequence[gs.Tensor], attrs: Mapping[str, object] | None = None, *,
            domain: str = "", outputs: Sequence[gs.Tensor] | int = 1, name: str | None = None) -> gs.Tensor | list:
        """The node's output (its outputs, where it has several)."""
        node = self._editor.node(op, inputs, attrs, name=name or f"{self._base}_{op.lower()}", outputs=outputs,
                                 domain=domain)
        self.nodes.append(node)
        return node.outputs[0] if len(node.outputs) == 1 else list(node.outputs)


class _Ops:
    """`builder.op.X(*inputs, **attributes)`: NodeBuilder.add of op X."""

    def __init__(self, builder: NodeBuilder):
        self._builder = builder

    def __getattr__(self, op: str):
        def build(*inputs: gs.Tensor, _domain: str = "", _outputs: Sequence[gs.Tensor] | int = 1,
                  _name: str | None = None, **attrs: object) -> gs.Tensor | list:
            return self._builder.add(op, inputs, attrs, domain=_domain, outputs=_outputs, name=_name)

        return build


def label(node: gs.Node) -> str:
    """How messages name a node: its name, or its op type when it has none (names are optional)."""
    return node.name or f"an unnamed {node.op}"


def _np_dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The If branches and Loop/Scan bodies a node holds."""
    found = []
    for value in node.attrs.values():
        found += [sub for sub in (value if isinstance(value, list) else [value]) if isinstance(sub, gs.Graph)]
    return found


def nested_graphs(graph: gs.Graph) -> Iterator[gs.Graph]:
    """Every body nested in `graph`'s nodes, outermost first (not `graph` itself)."""
    for node in graph.nodes:
        for sub in subgraphs(node):
            yield sub
            yield from nested_graphs(sub)


def every_tensor(graph: gs.Graph) -> Iterator[gs.Tensor]:
    """The tensors of `graph` and of every body in it, each once (a body shares the tensor
    objects of the outer scope it reads: a weight read only inside a branch is found there)."""
    seen: set[int] = set()
    for scope in (graph, *nested_graphs(graph)):
        for tensor in scope.tensors().values():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield tensor


def model_names(graph: gs.Graph) -> set[str]:
    """Every node and tensor name in `graph` and its bodies: what a new name must avoid."""
    names = {t.name for t in every_tensor(graph)}
    for scope in (graph, *nested_graphs(graph)):
        names.update(n.name for n in scope.nodes)
    return names


def toposort(graph: gs.Graph) -> None:
    """Sort nodes topologically, keeping the stored order among ready nodes. Iterative (Kahn):
    graphsurgeon's recursive sort overflows the stack on long chains stored out of order."""
    nodes = list(graph.nodes)
    position = {id(n): i for i, n in enumerate(nodes)}
    edges = [(position[id(t.inputs[0])], i) for i, node in enumerate(nodes) for t in _reads(node)
             if t.inputs and id(t.inputs[0]) in position]
    if all(a < b for a, b in edges):
        return  # already sorted: Kahn's lowest index first would keep the order as it is
    order, stuck = topological(len(nodes), edges)
    if stuck:
        node = nodes[stuck[0]]
        raise FuseError(f"invalid graph: it has a cycle through node {node.name or node.op!r}")
    ordered = [nodes[i] for i in order]
    graph.nodes = ordered


def _reads(node: gs.Node) -> Iterable[gs.Tensor]:
    """A node's inputs plus the outer-scope tensors its subgraphs read."""
    yield from node.inputs
    for sub in subgraphs(node):
        inner_nodes = {id(n) for n in sub.nodes}
        for inner in sub.nodes:
            for t in _reads(inner):
                if t.inputs and id(t.inputs[0]) not in inner_nodes:
                    yield t

