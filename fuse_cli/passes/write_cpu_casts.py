"""The Casts onnxruntime's CPU provider inserts around float16 nodes, written into the model."""

from __future__ import annotations

import onnx
from onnx import TensorProto

from fuse_cli.analysis.walk_setup import WalkGraph, walk_setup
from fuse_cli.core.order import runtime_order_by_producers
from fuse_cli.ops.cpu_float16 import inlined_at_float16
from fuse_cli.pipeline.base import Estimates, ModelPass, lower_without_growth, peak_change
from fuse_cli.pipeline.records import FusionRecord
from fuse_cli.pipeline.registry import register


@register
class WriteCpuCasts(ModelPass):
    """onnxruntime's CPU provider has no float16 MatMul, Add, Softmax or Conv: it runs such a node
    in float32 between Casts it inserts at load (analysis/inserted_casts.py). Inserted, the Casts
    take the highest node indices, and onnxruntime's default order (a reverse depth-first walk from
    the outputs, a node's producers highest index first) then runs each weight's Cast before the
    layers above its reader, so the float32 copy of every weight is alive at once:

        W1 ─ Cast ─┐                    stored first, a weight's Cast runs right before its reader:
        x ── ... ─ MatMul ── ... ─ MatMul ─ y
        W2 ─ Cast ─────────────────┘

    Written into the model, as onnxruntime itself saves a float16 model, the same Casts are stored
    nodes: the weights' Casts first (the lowest indices, so the walk reaches each last, right
    before its reader), every other node in onnxruntime's present order. The nodes run are the
    same, so are the values; the provider inserts nothing more. Measured on the float16 Llama
    decode step (transformers, TorchScript) at batch 1 over 128 cached tokens: 1.1 MiB -> 628 KiB
    allocated (benchmarks/results/llm_notes.md). At onnxruntime's basic level and above the
    weights' Casts are folded into float32 weights, as the ones it inserts are in the original at
    level all.

    A tensor an If or Loop body reads keeps its float16 self, as onnxruntime keeps it for the body.
    Nothing is written where the replay leaves in float16 a node the provider runs as its function
    body (a com.microsoft Gelu, a float16 Attention with a float32 mask: analysis/inlined_bodies.py):
    the provider would cast around the body's nodes beside the written Casts, one rounding more. A
    node the replay runs in float32 between Casts (a float16 Softmax-13, inlined in the original) is
    written in float32, where onnxruntime runs its float32 kernel instead of the body: the same
    arithmetic, in float32.

    Only for `--target ort-cpu`, where the CPU is the one provider: CUDA runs float16 itself.
    Kept only where the peak guard's estimate is never higher at any setting and lower beyond its
    noise somewhere (unhold_buffers' rule); runs before `unhold-buffers` and `schedule`, which then
    work on the nodes onnxruntime will run.
    """

    name = "write-cpu-casts"
    description = "Write the Casts onnxruntime's CPU provider inserts around float16 nodes into the model"
    label = "CPU float32 Casts -> stored"
    for_provider = "cpu"

    def run(self, model: onnx.ModelProto, estimates: Estimates) -> tuple[FusionRecord, ...]:
        if not _declares_float16(model.graph):
            return ()  # the shape inference the walk needs, spared where nothing can be float16
        graph = walk_setup(model, None, estimates.extra_weights).graph
        if not graph.float_copies or _inlined_in_float16(model.graph, graph):
            return ()
        try:
            before = estimates.peaks_by_rule(model)
        except ValueError:  # a stored order that is not topological (the memory model's check): as it is
            return ()
        # judged in place, the weights shared: only the nodes and declarations are kept to restore
        kept = onnx.GraphProto(node=model.graph.node, value_info=model.graph.value_info)
        after = None
        try:
            casts = write_casts(model, graph)
            after = estimates.peaks_by_rule(model)
        except ValueError:  # an order the memory model cannot walk
            pass
        finally:
            if after is None or not lower_without_growth(before, after):
                del model.graph.node[:], model.graph.value_info[:]
                model.graph.node.extend(kept.node)
                model.graph.value_info.extend(kept.value_info)
                after = None
        if after is None:
            return ()
        return (FusionRecord(self.name, self.label, (), tuple(casts), (),
                             peak_delta=peak_change(before, after)),)


def write_casts(model: onnx.ModelProto, graph: WalkGraph) -> list[str]:
    """`model`'s main graph as `graph` (its walk on the CPU provider) runs it: the inserted Casts
    become stored nodes and the stored nodes read and write the float32 copies. Returns the Casts'
    names."""
    stored = list(model.graph.node)
    order = runtime_order_by_producers(graph.producers, graph.indices, graph.leaves)
    producer = {name: i for i in range(len(graph.outputs)) for name in graph.outputs[i] if name}

    def weight_of(i: int) -> str | None:
        """The weight an inserted Cast reads (None: another node, or a Cast of an activation)."""
        source = graph.inputs[i][0] if graph.stored[i] is None else None
        return source if source is not None and source not in graph.activations else None

    # a weight's Cast first, or right after the node that makes the weight (a Constant)
    first: list[int] = []
    after: dict[int, list[int]] = {}
    for i in order:
        if (weight := weight_of(i)) is not None:
            (after.setdefault(producer[weight], []) if weight in producer else first).append(i)
    written = first + [j for i in order if weight_of(i) is None for j in (i, *after.get(i, ()))]
    nodes: list[onnx.NodeProto] = []
    for i in written:
        if graph.stored[i] is None:
            to = TensorProto.FLOAT if graph.outputs[i][0] in graph.float_copies else TensorProto.FLOAT16
            nodes.append(onnx.helper.make_node("Cast", list(graph.inputs[i]), list(graph.outputs[i]),
                                               name=graph.labels[i], to=to))
        else:
            node = onnx.NodeProto()
            node.CopyFrom(stored[graph.stored[i]])
            del node.input[:], node.output[:]
            node.input.extend(graph.inputs[i])
            node.output.extend(graph.outputs[i])
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    named = {name for node in nodes for name in (*node.input, *node.output)}
    kept = [vi for vi in model.graph.value_info if vi.name in named]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return [graph.labels[i] for i in written if graph.stored[i] is None]


def _inlined_in_float16(stored: onnx.GraphProto, graph: WalkGraph) -> bool:
    """A node the CPU provider runs as its function body that the replay leaves in float16 (a
    com.microsoft Gelu; a float16 Attention with a float32 mask, inlined_bodies.py): the provider
    would cast around the body's nodes beside the written Casts and not cancel them as it cancels
    its own (measured: one float16 rounding more), and the body is not replayed."""
    def float16(name: str) -> bool:
        info = graph.planner_shapes.get(name)
        return info is not None and info.elem_type == TensorProto.FLOAT16

    inlined = set(graph.inlined)
    inlined.update(p for p, node in enumerate(stored.node) if inlined_at_float16(node.domain, node.op_type))
    return any(graph.stored[i] in inlined and any(float16(name) for name in graph.inputs[i])
               for i in range(len(graph.stored)))


def _declares_float16(graph: onnx.GraphProto) -> bool:
    """Whether a weight, an input or output, a declared shape or a constant attribute is float16,
    or a node makes one from another type (a Cast or a dtype attribute; any CastLike)."""
    declared = (*graph.input, *graph.output, *graph.value_info)
    float16 = TensorProto.FLOAT16
    return (any(t.data_type == float16 for t in graph.initializer)
            or any(vi.type.tensor_type.elem_type == float16 for vi in declared)
            or any(node.op_type == "CastLike"
                   or any((a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == float16)
                          or (a.type == onnx.AttributeProto.TENSOR and a.t.data_type == float16)
                          for a in node.attribute)
                   for node in graph.node))
