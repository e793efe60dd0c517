"""Activation liveness: how many bytes are live while each node runs, and the peak.

The model is a sequential executor with no in-place reuse and no arena slack, walking the nodes
in execution order (the stored order, which ONNX requires to be topological; sorted if not):

- a graph input is live from step 0 until its last consumer; a graph output until the end;
- a node's outputs become live at its step; a tensor is freed after its last consumer's step;
- an output nobody reads (and that is not a graph output) is freed right after its own step;
- live bytes at step i = everything live before node i, plus node i's outputs: node i's inputs
  are still held while it runs.

Weights (initializers, Constant node outputs) are always resident and reported apart: counting
them would drown the activation peak that fusion changes. Tensors whose size is unknown are
excluded from every sum and listed, never counted as 0 silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import onnx

from fuse_cli.analysis.order import consumed_names, execution_order, node_label
from fuse_cli.analysis.shapes import ShapeTable, TensorInfo

INPUT_PRODUCER = "<input>"
_LARGEST_COUNT = 10
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class LiveTensor:
    """An activation of known size and who produced it (node label or `INPUT_PRODUCER`)."""

    name: str
    nbytes: int
    producer: str


@dataclass(frozen=True)
class MemoryProfile:
    """The liveness walk's result. A graph without nodes has peak_step -1 and peak_node ""."""

    peak_bytes: int
    peak_step: int
    peak_node: str
    live_at_peak: tuple[LiveTensor, ...]
    timeline: tuple[int, ...]
    intermediate_bytes: int
    by_op_type: Mapping[str, int]
    largest: tuple[LiveTensor, ...]
    unknown_tensors: tuple[str, ...]
    weight_bytes: int


def profile_memory(model: onnx.ModelProto, shapes: ShapeTable, *, extra_weights: Iterable[str] = (),
                   absent: Iterable[str] = ()) -> MemoryProfile:
    """Walk the top-level graph once and account every activation's lifetime.

    extra_weights: graph inputs to treat as weights (initializers set aside as input defaults).
    absent: tensors to count as 0 bytes, for "what if these intermediates did not exist".
    """
    graph = model.graph
    order = execution_order(graph)
    nodes = [graph.node[i] for i in order]
    consumed = [consumed_names(node) for node in nodes]
    last_step = len(nodes) - 1

    weights = _weight_names(graph) | set(extra_weights)
    absent = set(absent)
    graph_outputs = {vi.name for vi in graph.output}

    # Activations in birth order: graph inputs, then node outputs in execution order.
    birth: dict[str, int] = {}
    producer: dict[str, str] = {}
    for vi in graph.input:
        if vi.name and vi.name not in weights:
            birth[vi.name] = 0
            producer[vi.name] = INPUT_PRODUCER
    for step, (index, node) in enumerate(zip(order, nodes)):
        for name in node.output:
            if name and name not in weights:
                birth[name] = step
                producer[name] = node_label(node, index)

    last_use: dict[str, int] = {}
    for step, names in enumerate(consumed):
        for name in names:
            last_use[name] = step  # steps only grow, so the last write is the last consumer
    death = {
        name: last_step if name in graph_outputs else max(last_use.get(name, born), born)
        for name, born in birth.items()
    }

    sizes = {name: 0 if name in absent else shapes.nbytes(name) for name in birth}
    known = {name: size for name, size in sizes.items() if size is not None}
    unknown = tuple(name for name, size in sizes.items() if size is None)

    timeline = _timeline(len(nodes), known, birth, death)
    if timeline:
        peak_bytes = max(timeline)
        peak_step = timeline.index(peak_bytes)
        peak_node = node_label(nodes[peak_step], order[peak_step])
    else:
        peak_bytes, peak_step, peak_node = 0, -1, ""

    def live(names: Iterable[str]) -> tuple[LiveTensor, ...]:
        # Stable sort on birth order: ties stay in execution order.
        tensors = [LiveTensor(n, known[n], producer[n]) for n in names if n in known]
        return tuple(sorted(tensors, key=lambda t: -t.nbytes))

    # Traffic: every byte a node writes (Constant outputs are weights, already out of `known`).
    written: dict[str, int] = {}
    for node in nodes:
        for name in node.output:
            if name in known:
                written[node.op_type] = written.get(node.op_type, 0) + known[name]

    return MemoryProfile(
        peak_bytes=peak_bytes,
        peak_step=peak_step,
        peak_node=peak_node,
        live_at_peak=live(n for n in birth if birth[n] <= peak_step <= death[n]),
        timeline=tuple(timeline),
        intermediate_bytes=sum(written.values()),
        by_op_type=MappingProxyType(dict(sorted(written.items(), key=lambda kv: -kv[1]))),
        largest=live(birth)[:_LARGEST_COUNT],
        unknown_tensors=unknown,
        weight_bytes=_weight_bytes(graph, shapes),
    )


def _timeline(
    steps: int, known: Mapping[str, int], birth: Mapping[str, int], death: Mapping[str, int]
) -> list[int]:
    """Live bytes per step via a difference array: O(steps + tensors), not O(steps * live)."""
    if not steps:
        return []
    delta = [0] * (steps + 1)
    for name, size in known.items():
        delta[birth[name]] += size
        delta[death[name] + 1] -= size
    timeline, running = [], 0
    for step in range(steps):
        running += delta[step]
        timeline.append(running)
    return timeline


def _weight_names(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            names.update(name for name in node.output if name)
    return names


def _weight_bytes(graph: onnx.GraphProto, shapes: ShapeTable) -> int:
    """Resident constant bytes. Initializers are sized from their own dims (always known);
    Constant outputs from the shape table, else from their `value` tensor."""
    total = sum(_tensor_nbytes(t) or 0 for t in graph.initializer)
    total += sum(
        (_tensor_nbytes(t.values) or 0) + (_tensor_nbytes(t.indices) or 0)
        for t in graph.sparse_initializer
    )
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in _DEFAULT_DOMAINS or not node.output:
            continue
        size = shapes.nbytes(node.output[0])
        if size is None:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            size = _tensor_nbytes(value) if value is not None else None
        total += size or 0
    return total


def _tensor_nbytes(tensor: onnx.TensorProto) -> int | None:
    return TensorInfo(tensor.name, tensor.data_type, tuple(tensor.dims)).nbytes()
