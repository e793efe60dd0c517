"""The graph as the order search sees it: node indices, producers and readers, buffers and bytes.

Sizing (the search's own, fast and order-free; candidates are judged by the memory model itself):
activation bytes at the first shape setting; a view (Reshape and its kind) is its source's buffer;
an in-place kernel (Relu, ...) writes into its input's buffer when it reads it last and the sizes
agree; a kernel's scratch counts while it runs; weights never count, graph inputs always do.
Every rule is the memory model's (analysis/memory.py), only more permissive where the model asks
for a planner shape match, so `lower_bound` is a lower bound of the model's peak for any order.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from fuse_cli.analysis import memory
from fuse_cli.analysis.shapes import ShapeTable
from fuse_cli.core.order import consumed_names, execution_order, topological
from fuse_cli.graph.opset import default_opset


class Dag:
    def __init__(self, model: onnx.ModelProto, shapes: ShapeTable, extra_weights: Sequence[str] = ()):
        graph = model.graph
        self.nodes = list(graph.node)
        self.consumed = [consumed_names(node) for node in self.nodes]
        execution_order(graph, self.consumed)  # raises on a cycle
        weights = memory.weight_names(graph) | set(extra_weights)
        opset = default_opset(model)
        producer: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            for name in node.output:
                if name and producer.setdefault(name, i) != i:
                    raise ValueError(f"tensor {name!r} is written by two nodes")
        n = len(self.nodes)
        self.producers = [sorted({producer[t] for t in names if t in producer}) for names in self.consumed]
        self.readers: list[list[int]] = [[] for _ in range(n)]
        for i, sources in enumerate(self.producers):
            for j in sources:
                self.readers[j].append(i)
        # A view's buffer is its source's, read by the readers of every view of it.
        self.buffer_of: dict[str, str] = {}
        for node in self.nodes:
            for k, name in enumerate(node.output):
                if not name or name in weights:
                    continue
                source = node.input[0] if node.input else ""
                if k == 0 and source and memory.is_view(node, opset):
                    self.buffer_of[name] = self.buffer_of.get(source, source) if source not in weights else ""
                else:
                    self.buffer_of[name] = name
        self.graph_inputs = {vi.name for vi in graph.input if vi.name not in weights}
        for name in self.graph_inputs:
            self.buffer_of.setdefault(name, name)
        self.size = {b: shapes.nbytes(b) or 0 for b in set(self.buffer_of.values()) if b}
        self.held = {self.buffer_of.get(vi.name, vi.name) for vi in graph.output}
        self.buffer_readers: dict[str, set[int]] = {}
        for i, names in enumerate(self.consumed):
            for t in names:
                b = self.buffer_of.get(t)
                if b:
                    self.buffer_readers.setdefault(b, set()).add(i)
        self.writes = [[b for name in node.output if (b := self.buffer_of.get(name)) == name and b]
                       for node in self.nodes]
        self.reads = [sorted({b for t in names if (b := self.buffer_of.get(t))}) for names in self.consumed]
        self.workspace = [memory.workspace_bytes(node, shapes, opset) for node in self.nodes]
        self.in_place: list[str | None] = []  # the buffer an in-place kernel may write into
        for node in self.nodes:
            index = memory.in_place_input(node)
            source = node.input[index] if index is not None and len(node.input) > index else ""
            self.in_place.append(self.buffer_of.get(source) if source else None)
        self.out_bytes = [sum(self.size.get(b, 0) for b in self.writes[i]) for i in range(n)]
        self.input_bytes = sum(self.size.get(b, 0) for b in self.graph_inputs)

    def roots(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if not self.readers[i]]

    def simulate(self, order: Sequence[int]) -> int:
        """The search's peak of running `order` (the module docstring's sizing)."""
        position = ranks(order)
        last: dict[str, int] = {}
        for b, readers in self.buffer_readers.items():
            if b not in self.held and b not in self.graph_inputs:
                last[b] = max(position[i] for i in readers)
        live, peak = self.input_bytes, 0
        size, workspace, out_bytes, in_place = self.size, self.workspace, self.out_bytes, self.in_place
        for step, i in enumerate(order):
            alloc = out_bytes[i]
            freed = sum(size.get(b, 0) for b in self.reads[i] if last.get(b) == step)
            source = in_place[i]
            if source and alloc and last.get(source) == step and size.get(source, 0) == alloc:
                alloc, freed = 0, freed - alloc
            peak = max(peak, live + alloc + workspace[i])
            live += alloc - freed
        return peak

    def lower_bound(self) -> int:
        """No order runs below this: a node needs its inputs, its outputs and its scratch at once
        (an in-place output shares its input's bytes), the caller's inputs stay alive throughout,
        and the last step holds every graph output. O(nodes + edges)."""
        bound = self.input_bytes + sum(self.size.get(b, 0) for b in self.held if b not in self.graph_inputs)
        for i in range(len(self.nodes)):
            reads = sum(self.size.get(b, 0) for b in self.reads[i] if b not in self.graph_inputs)
            out = self.out_bytes[i]
            source = self.in_place[i]
            if source and source not in self.graph_inputs and self.size.get(source, 0) == out:
                out = 0
            bound = max(bound, self.input_bytes + reads + out + self.workspace[i])
        return bound


def ranks(order: Sequence[int]) -> list[int]:
    """Position of each node in `order`."""
    rank = [0] * len(order)
    for position, i in enumerate(order):
        rank[i] = position
    return rank


def topological_order(producers: Sequence[Sequence[int]]) -> list[int]:
    """A topological order of node indices given each node's producers, the lowest index first
    among ready nodes (core.order's one Kahn sort)."""
    order, _ = topological(len(producers), ((j, i) for i, sources in enumerate(producers) for j in sources))
    return order
