"""Views that keep onnxruntime's allocation planner from holding a dead buffer across the peak."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from fuse_cli.analysis.memory import weight_names
from fuse_cli.graph.edit import unique_name
from fuse_cli.graph.opset import default_opset
from fuse_cli.pipeline.base import Estimates, ModelPass
from fuse_cli.pipeline.records import FusionRecord
from fuse_cli.pipeline.registry import register
from fuse_cli.scheduling import gain_needed

# Views tried per model: each is judged by a walk of the memory model at every shape setting.
MAX_TRIES = 8


@register
class UnholdBuffers(ModelPass):
    """onnxruntime's planner hands a dead buffer to a later tensor of the same planner shape (its
    dims, named or valued, as its inference left them), and with the arena off that buffer stays
    allocated from its first tenant's birth to its last tenant's death (analysis/memory.py). Where
    that stretch spans the peak with no tenant alive, the peak holds a buffer nobody uses:

        x ─ Conv ─ a ─ Conv ─ b ──────────────────── Concat ─ Conv ─ c ─ Conv ─ d
                  (a dies)      ... the peak ...                        (d takes a's buffer:
                                                                         a's bytes held all along)

    U-Nets do it across their bottleneck: a skip connection's neighbour is freed on the way down
    and its buffer waits for the same-shaped tensor on the way up (unet-small at batch 8: 176.1
    MiB estimated and measured; 151.6 with the view below, as onnx-simplifier's output has, whose
    exported dims onnxruntime cannot name).

    The later tensor's producer reads its input through Reshape(x, Shape(x)), a view (no bytes,
    no copy) whose dims onnxruntime's inference cannot name where x has a symbolic dim, and the
    producer's outputs lose their declared shapes (value_info, which onnxruntime would merge the
    names back from), so the producer's output matches no buffer freed before and the dead one is
    released where it dies. Each view is judged by the
    peak guard's own estimate, as the node order is: kept only when never worse at any setting
    under any execution rule and lower by a gain the estimate vouches for (scheduling.gain_needed)
    at the bound dims, or at the guard's larger setting where the output peaks above the original
    there (a prefill at batch 64 holds the MLP's buffers through the next layer's attention, at
    batch 1 it does not: the view is what lets the guard keep the fusion). Then the next held
    buffer, up to MAX_TRIES. Runs after every fusion, before `schedule`.
    """

    name = "unhold-buffers"
    description = "Keep onnxruntime's planner from holding a dead buffer across the peak (an unnamed view)"
    label = "held buffer -> unnamed view"

    def run(self, model: onnx.ModelProto, estimates: Estimates) -> tuple[FusionRecord, ...]:
        if estimates.held is None or default_opset(model) < 5:  # Reshape takes its shape as an input from 5
            return ()
        records: list[FusionRecord] = []
        try:
            current = _peaks(model, estimates)
        except ValueError:  # a stored order that is not topological (the memory model's check): as it is
            return ()
        tried: set[str] = set()
        limits = estimates.limits() if estimates.limits is not None else ()
        for _ in range(MAX_TRIES):
            target = next((t.name for t in estimates.held(model) if t.name not in tried), None)
            if target is None:
                break
            tried.add(target)
            view = _insert_view(model, target)
            if view is None:
                continue
            try:
                after = _peaks(model, estimates)
            except ValueError:
                after = None
            if after is None or not _better(current, after, limits):
                _remove_view(model, view)
                continue
            records.append(FusionRecord(self.name, self.label, (), view.created, (),
                                        peak_delta=after["onnxruntime"][0] - current["onnxruntime"][0]))
            current = after
        return tuple(records)


@dataclass(frozen=True)
class _View:
    source: str                # the producer's input, as it was
    viewed: str                # what the producer reads now: Reshape(source, Shape(source))
    created: tuple[str, str]   # the Shape and Reshape nodes' names
    undeclared: tuple[onnx.ValueInfoProto, ...]  # the producer's outputs' value_info, taken out


def _peaks(model: onnx.ModelProto, estimates: Estimates) -> dict[str, tuple[int, ...]]:
    """The estimated peaks per execution rule and setting; onnxruntime's always (the report's)."""
    orders = {"onnxruntime": None, "stored": list(range(len(model.graph.node)))}
    return {rule: estimates.peaks(model, orders[rule]) for rule in {"onnxruntime", *estimates.rules}}


def _better(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]], limits: tuple[int, ...]) -> bool:
    """Never worse at any setting under any rule, and lower by a gain the estimate vouches for at
    the bound dims, or at a larger setting where onnxruntime's order peaks above the original's
    (`limits`: what the guard would refuse; elsewhere a larger setting is a guard, not a goal)."""
    never_worse = all(a <= b for rule in before for a, b in zip(after[rule], before[rule]))
    goals = [(rule, 0) for rule in before] + [("onnxruntime", i) for i, limit in enumerate(limits)
                                              if i and before["onnxruntime"][i] > limit]
    return never_worse and any(before[rule][i] - after[rule][i] >= gain_needed(before[rule][i]) for rule, i in goals)


def _insert_view(model: onnx.ModelProto, tensor: str) -> _View | None:
    """Reshape(x, Shape(x)) between `tensor`'s producer and its first input x, stored just before
    the producer; None where x is a weight (its dims are the initializer's own)."""
    graph = model.graph
    nodes = list(graph.node)
    index = next((i for i, node in enumerate(nodes) if tensor in node.output), None)
    if index is None or not nodes[index].input or not nodes[index].input[0]:
        return None
    producer, source = nodes[index], nodes[index].input[0]
    if source in weight_names(graph):
        return None
    taken = _names(graph)
    shape, viewed = unique_name(f"{source}_shape", taken), unique_name(f"{source}_unnamed", taken)
    shape_node = helper.make_node("Shape", [source], [shape], name=unique_name(f"{source}_shape_of", taken))
    view_node = helper.make_node("Reshape", [source, shape], [viewed], name=unique_name(f"{source}_unnamed_view", taken))
    for k, name in enumerate(producer.input):
        if name == source:
            producer.input[k] = viewed
    graph.node.insert(index, view_node)
    graph.node.insert(index, shape_node)
    # A declared shape is what onnxruntime's inference merges into, and it would name the dims anyway
    # (dynamo's exports declare every tensor, and graphsurgeon writes what it knows).
    outputs = set(producer.output)
    undeclared = tuple(vi for vi in graph.value_info if vi.name in outputs)
    if undeclared:
        kept = [vi for vi in graph.value_info if vi.name not in outputs]
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return _View(source, viewed, (shape_node.name, view_node.name), undeclared)


def _remove_view(model: onnx.ModelProto, view: _View) -> None:
    graph = model.graph
    kept = [node for node in graph.node if node.name not in view.created]
    for node in kept:
        for k, name in enumerate(node.input):
            if name == view.viewed:
                node.input[k] = view.source
    del graph.node[:]
    graph.node.extend(kept)
    graph.value_info.extend(view.undeclared)


def _names(graph: onnx.GraphProto) -> set[str]:
    names = {node.name for node in graph.node}
    names.update(name for node in graph.node for name in node.output)
    names.update(t.name for t in graph.initializer)
    names.update(vi.name for vi in (*graph.input, *graph.output, *graph.value_info))
    return names
