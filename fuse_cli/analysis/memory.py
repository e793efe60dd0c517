"""Activation liveness as onnxruntime's CPU executor really allocates it, and the peak.

The walk replays onnxruntime's sequential executor with graph optimizations disabled and the
memory arena and memory pattern off: the setting `fuse_cli.analysis.measure` runs to check it.
Each rule was read in onnxruntime's source and confirmed by measuring onnxruntime 1.31 on small
probe graphs (tests/test_analysis_measure.py keeps the bundled samples within 15%). Over every
corpus (exports and their fp16 copies, fp32 and fp16 decoders, control flow, recurrent,
quantized, wheels) before and after fusion, 1127 of 1137 comparisons with an allocated peak of
1 MiB or more are within 15%; the rest are float16 dynamo decoders, whose float32 copies
onnxruntime's planner shares more than the walk does (benchmarks/results/memory_truth.md). On the
CPU provider the nodes walked are those it runs: with the float32 Casts it inserts around float16
nodes it has no float16 kernel for (analysis/inserted_casts.py).

The model, a module per job:
- order: onnxruntime's default execution order, not the stored one (core/order.py, `runtime_order`);
- shapes: the shapes its allocation planner compares, onnxruntime's own inference (planner_shapes.py);
- buffers and lifetimes: the planner's reuse plan, replayed on names (planner.py), over a model
  prepared once for all its walks (walk_setup.py);
- workspace: kernel scratch, live while its node runs, by each operator's record (fuse_cli/ops/:
  Conv and FusedConv, Dropout, Sum/Mean/Max/Min, BiasGelu and FastGelu with a bias,
  MultiHeadAttention, Attention, GroupQueryAttention, LRN, Where, HardSwish and Mish, LSTM).
  Gelu, FastGelu without a bias, FusedMatMul, FusedConv's 1x1 GEMM, SkipLayerNormalization,
  LayerNormalization and SimplifiedLayerNormalization measured none; If, Loop and Scan: the body
  that runs, walked as a graph of its own (analysis/bodies.py);
- the profile: the walk over them, the peak and what is live there (this module).

Not modelled, being small next to activations: allocator rounding (under a page per buffer),
blocks glibc serves from its own heap, kernels' per-row scratch, thread stacks; with T intra-op
threads the Conv tile is T tiles.

Weights (initializers, Constant node outputs) are always resident and reported apart: counting
them would drown the activation peak that fusion changes. Tensors whose size is unknown are
excluded from every sum and listed, never counted as 0 silently.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from fuse_cli.analysis import walk_setup as setups
from fuse_cli.analysis.bodies import BodyCost
from fuse_cli.analysis.planner import BufferPlan, buffer_plan, in_place_input, is_view
from fuse_cli.analysis.planner_shapes import SHAPE_VALUE_INPUT, planner_shapes
from fuse_cli.analysis.shapes import ShapeTable, paused_gc
from fuse_cli.analysis.walk_setup import INPUT_PRODUCER, WalkSetup, WalkSizes, walk_setup, weight_names
from fuse_cli.core.order import runtime_order, runtime_order_of
from fuse_cli.ops import workspace_bytes
from fuse_cli.ops.multi_head_attention import flash_attention_buffer, l2_cache_bytes

# The profile's names, and those importers used from before the model was split into modules.
__all__ = (
    "HeldBuffer", "INPUT_PRODUCER", "LiveTensor", "MemoryProfile", "SHAPE_VALUE_INPUT", "WORKSPACE",
    "flash_attention_buffer", "in_place_input", "is_view", "l2_cache_bytes", "planner_shapes", "profile_memory",
    "profile_memory_at", "runtime_order", "runtime_order_of", "weight_names", "workspace_bytes",
)
# The prepared-model caches, by the names a cold walk empties
_GRAPHS, _NODE_FIELDS = setups._GRAPHS, setups._NODE_FIELDS

WORKSPACE = "<workspace>"
_LARGEST_COUNT = 10


@dataclass(frozen=True)
class LiveTensor:
    """An activation of known size and who produced it (node label or `INPUT_PRODUCER`).

    In `live_at_peak` it stands for a buffer: the tensor then occupying it (or, for a buffer held
    for reuse, its last tenant); a kernel's scratch is named `WORKSPACE`, produced by its node.
    """

    name: str
    nbytes: int
    producer: str


@dataclass(frozen=True)
class HeldBuffer:
    """A buffer alive at the peak with no tenant alive: the planner keeps it for the tensors that
    take it after the peak (`tenants`, in birth order)."""

    tenants: tuple[str, ...]
    nbytes: int
    producer: str  # the first later tenant's

    @property
    def name(self) -> str:
        """The first tensor to take the buffer after the peak."""
        return self.tenants[0]


@dataclass(frozen=True)
class MemoryProfile:
    """The liveness walk's result. A graph without nodes has peak_step -1 and peak_node "".

    Steps follow onnxruntime's execution order. `intermediate_bytes` and `by_op_type` count the
    bytes each node writes (a view made by Reshape and its kind writes none).
    """

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
    # What no execution order can free at the peak step: the peak node's inputs, outputs and
    # scratch, and the graph inputs. The peak less this bounds what any reordering can gain.
    unavoidable_at_peak: int = 0
    # Buffers alive at the peak with no tenant alive: the planner keeps a dead buffer allocated
    # for later tensors of the same planner shape. Biggest first.
    held_across_peak: tuple[HeldBuffer, ...] = ()
    # The control-flow nodes whose bodies are counted at their step (analysis/bodies.py), in
    # stored order: which branch or body, and its own peak.
    bodies: tuple[BodyCost, ...] = ()


def profile_memory(model: onnx.ModelProto, shapes: ShapeTable, *, extra_weights: Iterable[str] = (),
                   absent: Iterable[str] = (), symbolic_shapes: ShapeTable | None = None,
                   order: Sequence[int] | None = None, provider: str = "cpu") -> MemoryProfile:
    """Walk the top-level graph once and account every activation's lifetime.

    shapes: sizes at the user's bindings. symbolic_shapes: the model's shapes with no dim bound,
    as onnxruntime's planner compares them; inferred from `model` when not given.
    extra_weights: graph inputs to treat as weights (initializers set aside as input defaults).
    absent: tensors that take no memory, for "what if these intermediates did not exist".
    order: the nodes run in this order (indices into graph.node, a topological order) instead of
    onnxruntime's: what another stored order, or a runtime that follows the stored order, would do.
    provider: "cpu" walks the float32 Casts onnxruntime's CPU provider inserts around float16 nodes
    it has no float16 kernel for (analysis/inserted_casts.py); "cuda" the nodes as stored.
    Raises ValueError when the graph has a cycle or `order` is not a topological order.
    """
    return profile_memory_at(model, (shapes,), extra_weights=extra_weights, absent=absent,
                             symbolic_shapes=symbolic_shapes, order=order, provider=provider)[0]


def profile_memory_at(model: onnx.ModelProto, tables: Sequence[ShapeTable], *, extra_weights: Iterable[str] = (),
                      absent: Iterable[str] = (), symbolic_shapes: ShapeTable | None = None,
                      order: Sequence[int] | None = None, provider: str = "cpu") -> tuple[MemoryProfile, ...]:
    """profile_memory at each of several shape settings (`tables`): the buffer plan reads no
    sizes, so one walk serves them all."""
    with paused_gc():
        setup = walk_setup(model, symbolic_shapes, extra_weights, order, provider)
        absent = frozenset(absent)
        buffers = buffer_plan(setup, absent)
        return tuple(_profile(setup, buffers, setup.sized(shapes), absent) for shapes in tables)


def _profile(setup: WalkSetup, plan: BufferPlan, sized: WalkSizes, absent: frozenset[str]) -> MemoryProfile:
    graph = setup.graph
    labels, producer = setup.labels, setup.producer
    if absent:
        # a float32 copy onnxruntime's CPU provider makes of an absent tensor is absent too
        copies = graph.float_copies
        known = {name: 0 if name in absent or copies.get(name) in absent else size
                 for name, size in sized.known.items()}
        unknown = tuple(name for name in sized.unknown if name not in absent and copies.get(name) not in absent)
    else:
        known, unknown = sized.known, sized.unknown
    workspace = sized.workspace
    if sized.held_workspace and (held := plan.held_outputs.intersection(sized.held_workspace)):
        workspace = list(workspace)
        for step in held:
            workspace[step] = sized.held_workspace[step]
    steps = len(labels)
    if steps:
        # Live bytes per step by a difference array over the buffers' lifetimes.
        sizes = np.fromiter((known.get(name, 0) or 0 for name in plan.first), dtype=np.int64, count=len(plan.first))
        delta = np.zeros(steps + 1, dtype=np.int64)
        np.add.at(delta, plan.births, sizes)
        np.add.at(delta, plan.deaths + 1, -sizes)
        live_bytes = np.cumsum(delta[:steps]) + np.asarray(workspace, dtype=np.int64)
        peak_step = int(live_bytes.argmax())  # the first step at the peak
        peak_bytes, peak_node = int(live_bytes[peak_step]), labels[peak_step]
        timeline = tuple(live_bytes.tolist())
    else:
        peak_bytes, peak_step, peak_node, timeline = 0, -1, "", ()

    def by_size(tensors: Iterable[LiveTensor]) -> tuple[LiveTensor, ...]:
        # Stable sort on birth order: ties stay in execution order.
        return tuple(sorted(tensors, key=lambda t: -t.nbytes))

    first = plan.first
    alive = [index for index in (np.flatnonzero((plan.births <= peak_step) & (plan.deaths >= peak_step)).tolist()
                                 if steps else ()) if first[index] in known]
    occupant = plan.occupants(set(alive), peak_step)
    live = [LiveTensor(occupant[index], known[first[index]], producer[occupant[index]]) for index in alive]
    live.sort(key=lambda t: plan.birth_rank[t.name])
    if peak_step >= 0 and workspace[peak_step]:
        live.append(LiveTensor(WORKSPACE, workspace[peak_step], peak_node))

    own = set(graph.graph_inputs)
    if peak_step >= 0:
        stored = setup.order[peak_step]
        own.update(graph.reads[stored], graph.outputs[stored])
    # A view's buffer is listed under its source's name, which may not be the node's own: counted
    # as avoidable, so the bound stays a bound. The scratch too: the least the kernel needs in any
    # plan (a variadic node's output written fresh, not into a held buffer).
    unavoidable = sum(t.nbytes for t in live if t.name in own) + (sized.workspace[peak_step] if peak_step >= 0 else 0)

    held_across_peak = _held_across_peak(setup, plan, alive, peak_step, known, producer) if steps else ()

    written: dict[str, int] = {}
    for op_type, name in zip(plan.write_ops, plan.writes):
        size = known.get(name)
        if size is not None:
            written[op_type] = written.get(op_type, 0) + size

    return MemoryProfile(
        peak_bytes=peak_bytes,
        peak_step=peak_step,
        peak_node=peak_node,
        live_at_peak=by_size(live),
        timeline=timeline,
        intermediate_bytes=sum(written.values()),
        by_op_type=MappingProxyType(dict(sorted(written.items(), key=lambda kv: -kv[1]))),
        largest=tuple(LiveTensor(n, known[n], producer[n]) for n in _largest(producer, known)),
        unknown_tensors=unknown,
        weight_bytes=sized.weight_bytes,
        unavoidable_at_peak=unavoidable,
        held_across_peak=held_across_peak,
        bodies=sized.bodies,
    )


def _held_across_peak(setup: WalkSetup, plan: BufferPlan, alive: list[int], peak_step: int, known: Mapping[str, int],
                      producer: Mapping[str, str]) -> tuple[HeldBuffer, ...]:
    """MemoryProfile.held_across_peak: of the buffers alive at `peak_step` (indices), those whose
    tenants born by then are all dead (read last before it; graph inputs and outputs are held),
    each with its tenants born after it."""
    kept = setup.graph.graph_outputs.union(setup.graph.graph_inputs)
    last_read, birth = setup.last_read, plan.birth
    candidates = set(alive)
    busy: set[int] = set()
    later: dict[int, list[str]] = {}
    for name, buffer in zip(plan.tenants, plan.tenant_buffers):
        if buffer not in candidates:
            continue
        if birth[name] <= peak_step:
            if name in kept or last_read.get(name, birth[name]) >= peak_step:
                busy.add(buffer)
        else:
            later.setdefault(buffer, []).append(name)
    held = [HeldBuffer(tuple(later[b]), known[plan.first[b]], producer[later[b][0]]) for b in alive
            if b not in busy and b in later]
    return tuple(sorted(held, key=lambda t: -t.nbytes))


def _largest(producer: Mapping[str, str], known: Mapping[str, int]) -> list[str]:
    """The _LARGEST_COUNT largest known tensors, ties in birth (producer) order: what
    heapq.nlargest over the producer order gives (sorted(reverse=True)[:n]), without a key call
    per tensor: only those at or above the n-th largest size are sorted."""
    sizes = heapq.nlargest(_LARGEST_COUNT, known.values())
    threshold = sizes[-1] if len(sizes) == _LARGEST_COUNT else -1
    above = [name for name in producer if known.get(name, -1) >= threshold and name in known]
    return sorted(above, key=lambda name: -known[name])[:_LARGEST_COUNT]

