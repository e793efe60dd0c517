"""Activation liveness as onnxruntime's CPU executor really allocates it, and the peak.

The walk replays onnxruntime's sequential executor with graph optimizations disabled and the
memory arena and memory pattern off: the setting `fuse_cli.analysis.measure` runs to check it.
Each rule was read in onnxruntime's source and confirmed by measuring onnxruntime 1.31 on small
probe graphs (tests/test_analysis_measure.py keeps the bundled samples within 15%). Over the
samples, the light zoo, 68 corpus exports and 16 decoders before and after fusion, 507 of 512
comparisons with a measured peak of 1 MiB or more are within 15%, and all of 16 MiB or more
within 6% (benchmarks/results/memory_truth.md, with the causes of the rest).

Order. onnxruntime's default execution order, not the stored one: a reverse depth-first walk
from the nodes no node reads, emitting each node after its producers and visiting a node's
producers highest stored index first (GraphViewer's constructor and Graph::ReverseDFSFrom with
NodeCompare, onnxruntime/core/graph/graph_viewer.cc and graph.cc). Of two independent branches
the one stored later runs first: the transformer sample computes keys before queries, and
values only after the softmax.

Buffers. For each output of each node the allocation planner (PlannerImpl::
ComputeSingleStreamReusePlan, onnxruntime/core/framework/allocation_planner.cc) takes the first
that applies:
1. a graph output gets a buffer of its own (kAllocateOutput), never shared;
2. an output its kernel declares an Alias of an input is that input's buffer, no new bytes
   (FindReusableInput; Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout before opset 12);
3. an output its kernel may compute in place (KernelDef MayInplace: the activations of
   cpu/activation/activations.cc, Clip, Softmax and LogSoftmax on float, Cast, Trilu,
   ScatterElements, FusedConv's residual input) takes that input's buffer when this node is the
   buffer's last reader and both have the same element size and the same shape as the planner
   sees it (below). Add, Sub, Mul, Div, Pow, Neg, Exp, Erf, Sqrt and Gelu declare no in-place on
   the CPU provider: measured, they always take another buffer;
4. a dead buffer of the same element size and planner shape, the most recently freed first
   (FindReusableTensor; never for a scalar);
5. a new buffer.
The planner compares shapes before any dim is bound: the model's own shapes (`symbolic_shapes`),
where `batch` equals `batch` but a dim that shape inference could not name (Reshape's -1 of a
symbolic input) equals nothing, so such tensors never share.

Shapes. The shapes the planner compares are onnxruntime's own graph inference, which differs
from onnx's (`infer_shapes`) in ways that decide whether buffers are shared (`planner_shapes`):
- onnx names each dim it cannot infer with a placeholder of its own (unk__N) and then carries that
  placeholder where onnxruntime, which makes none, takes another input's name: Concat's merge of
  an unknown dim with `batch` is `batch` in onnxruntime, unk__N in onnx, and so is everything
  downstream. fuse redoes Concat's and broadcasting's merges on the placeholder dims and passes
  the result through (`ShapeTable.placeholders` says which unknown dim onnx copied from which);
- onnx's data propagation reads the values of shape tensors computed at run time (Shape ->
  Gather -> Concat -> Reshape) and names the result's dims; onnxruntime's graph inference reads
  no such values: a runtime-shaped Reshape is [?, ?, ?] there, and so is whatever is inferred
  from it. Where a model has such a node, onnx's inference runs once more without data
  propagation and its unknown dims are marked as placeholders to redo;
- a shape the model declares (value_info, graph outputs) is where onnxruntime's inference merges
  into (NodeArg::UpdateTypeAndShape, onnx's mergeInShapeInfo: an inferred value fills or wins,
  a declared name stands where the inference knows nothing): declared dims are never redone.
  Exporters that write value_info (torch's dynamo exporter) thus keep `batch` through attention
  blocks whose inference alone would lose it.
Evidence (onnxruntime 1.31.1 CPU, DISABLE_ALL): each node output made a graph output (with no
shape but what value_info declares) and read back from the session: equal to `planner_shapes` for every tensor whose
planner key is known on timm deit-tiny opset 13 fused for onnx and ort-cpu (503 tensors); for
every float tensor of 64 KiB or more at batch 1 on the held-out hf-vit-tiny, bert-small,
gpt2-small, llama-gqa (opset 14 and dynamo), qwen2-small dynamo, t5-encoder opset 14 and
whisper-encoder dynamo exports, before fusion and fused for onnx and ort-cpu, but one tensor
of gpt2-small opset 14 (onnxruntime does fold shape values that are wholly static, such as
Shape of a [4] tensor: not modelled). Dynamo exports of hf-vit-tiny, gpt2-small, qwen2-small
and llama-gqa went from 0.75-0.89x (0.35-0.5x fused) to 1.00x at their large settings.
deit-tiny's fused form at batch 1 measured 4.8 MiB, which
the old table put at 2.45 (it found no buffer to share) and this one at 4.92.

Operators onnx cannot infer (com.microsoft FusedMatMul, FusedConv, FusedGemm, Gelu and its
kin, SkipLayerNormalization, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding;
onnxruntime's internal SimplifiedLayerNormalization and LayerNormalization before opset 17) are
inferred through standard stand-ins (shapes.py), as onnxruntime's own schemas infer them. The
planner depends on it: MultiHeadAttention's output is [query[0], query[1], value[2]], or
value[1] * value[3] for a [B, N, L, H] value; a stand-in that made it 4-D lost every shape after
attention, so the estimate shared no buffer there, while onnxruntime gave the MLP of the next
layer the dead MLP buffers of the one before, held across the attention in between. The opset 17
Llama and Qwen2 decode exports fused for ort-cpu at batch 16, 128 new and 128 cached positions
estimated 25.05 MiB and measured 33.06 and 33.3 (three [16, 128, 344] buffers held); now 33.11
and 33.30 (tests/test_analysis_measure.py, test_attention_output_shape_lets_buffers_be_held_across_it).

Lifetimes. A graph input belongs to the caller and is live for the whole run (kPreExisting, and
the caller holds it). A buffer is released after the last node that reads any tensor it held
(GenerateDeallocationPlan); one holding a graph output or a tensor nobody reads is held to the end
of the run. A dead buffer the planner hands to a later tensor is not released in between: its
bytes count from its first tenant's birth to its last tenant's death.

Workspace. Kernel scratch, live while its node runs:
- Conv and FusedConv on float (MlasConvPrepare, onnxruntime/core/mlas/lib/convolve.cpp, with one
  intra-op thread): nothing for a pointwise conv (1x1 kernel, stride 1, no padding); the whole
  im2col matrix (output pixels x K floats) when the filters per group outnumber the output
  pixels; else one 128x128-float tile (64 KiB) per thread;
- Dropout from opset 12 without a mask output fills a mask anyway: one byte per element
  (cpu/nn/dropout_op.h);
- Sum, Mean, Max and Min over n > 2 inputs combine them pairwise into temporaries, two alive at
  once while n > 3, and ask for their output only for the last pair (UntypedBroadcastVariadic):
  a fresh output takes the place of the first temporary, one the planner handed a held buffer
  does not, so the scratch depends on the plan (_Plan.held_outputs; randwire networks, found
  by memray's exact count: one 0.38 MiB temporary missing at the peak);
- com.microsoft BiasGelu, and FastGelu given a bias, write input + bias into a temporary the
  size of the output before the Erf/Tanh pass (BiasGelu::Compute, contrib_ops/cpu/bert/
  bias_gelu.cc); measured: one output's worth. Gelu, FastGelu without a bias, FusedMatMul,
  FusedConv's 1x1 GEMM, SkipLayerNormalization, LayerNormalization and
  SimplifiedLayerNormalization measured none;
- com.microsoft MultiHeadAttention (contrib_ops/cpu/bert/multihead_attention.cc) copies query,
  key and value, bias added, into [B, N, S, H], [B, N, L, H] and [B, N, L, H_v] buffers from the
  temp-space allocator (MaybeTransposeToBNSHAndAddBias, attention_utils.cc): as many bytes as
  the three inputs, all held until the kernel returns, together with its inputs and output. Key
  and value given as [B, N, L, H] are used as they are, not copied. With no mask, attention
  bias, past or present, and not unidirectional, it runs MlasFlashAttention, whose tile buffer
  is a few Q rows by a block of keys per thread, sized to the L2 cache: not modelled. Otherwise
  ApplyAttention (attention_cpu_base.h) also holds the attention probabilities [B, N, S, T]
  (T = past + L) and the output before its transpose [B, N, S, H_v] until it returns; measured
  with a key padding mask, no [B, S, T] mask buffer stayed resident. Measured on onnxruntime
  1.31 for batch, sequence, key length, heads and head size: within 0.2 MiB of the formula.

- com.microsoft GroupQueryAttention (contrib_ops/cpu/bert/group_query_attention.cc): a head-major
  query copy, present-sized K/V buffers [B, KV, T, H] (with or without its present outputs) and,
  unless causal=1 with the presents returned, the probabilities [B, N, S, T]; measured (see
  _group_query_attention_workspace);

- LRN on float (cpu/nn/lrn.cc) takes two buffers from the temp-space allocator: the scale, as
  big as its input, and one image's padded squares, (C + size - 1) x H x W floats. Measured on
  onnxruntime 1.31.1 at [4, 64, 64, 64]: input + output + 5.06 MiB (tests/test_analysis_measure.py);
  it was what kept the zoo's inception_v1 at 0.67x (192 channels at 55 x 55: 4.4 MiB);

- Where (cpu/tensor/where_op.cc) broadcasts in two steps: condition with X into a selection
  tensor, condition with Y into another, both allocated from the kernel's tensor allocator and
  held until it returns, then merges them into the output: scratch of broadcast(condition, X)
  plus broadcast(condition, Y) elements of the output's type. Measured on onnxruntime 1.31.1
  (tests/test_analysis_measure.py); it is the attention mask guard of torch's dynamo exports
  (Where(IsNaN(softmax), 0, softmax)), which left hf-vit-tiny's dynamo export at 0.85x;

- HardSwish and Mish have no CPU kernel: onnxruntime runs their function bodies (HardSigmoid,
  Mul; Softplus, Tanh, Mul), which hold one intermediate of the output's size: measured on
  onnxruntime 1.31.1, [16, 256, 256] float: input + output + 4 MiB (tests/test_analysis_measure.py).

- LSTM on float (cpu/rnn/deep_cpu_lstm.cc): the gates of every step and the states (_lstm_workspace);

- If, Loop and Scan: the body that runs, walked as a graph of its own (analysis/bodies.py).

Not modelled, being small next to activations: allocator rounding (under a page per buffer),
blocks glibc serves from its own heap, kernels' per-row scratch, thread stacks; with T intra-op
threads the Conv tile is T tiles.

Weights (initializers, Constant node outputs) are always resident and reported apart: counting
them would drown the activation peak that fusion changes. Tensors whose size is unknown are
excluded from every sum and listed, never counted as 0 silently.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuse_cli.analysis.bodies import CONTROL_FLOW_OPS, BodyCost, Scope, body_cost, scope
from fuse_cli.core.order import consumed_names, execution_order, may_hold_subgraphs, model_fingerprint, node_label
from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, element_size_bits, infer_shapes, paused_gc

INPUT_PRODUCER = "<input>"
WORKSPACE = "<workspace>"
_LARGEST_COUNT = 10
_DEFAULT_DOMAINS = ("", "ai.onnx")
_MS_DOMAIN = "com.microsoft"

# Kernels whose output 0 is a view of input 0 (KernelDefBuilder().Alias(0, 0)), keyed by
# (domain, op_type) -> (first opset, last opset) of the aliasing kernels.
_ALIAS_OPS: Mapping[tuple[str, str], tuple[int, int]] = {
    ("", "Reshape"): (1, 10**6),
    ("", "Flatten"): (1, 10**6),
    ("", "Squeeze"): (1, 10**6),
    ("", "Unsqueeze"): (1, 10**6),
    ("", "Identity"): (1, 10**6),
    ("", "Dropout"): (1, 11),  # IdentityOp<true>; from opset 12 a real kernel with a mask
}

_FLOAT_ONLY = frozenset({TensorProto.FLOAT})
# (domain, op_type) -> (input index, element types the in-place kernel is registered for, None:
# every type the op has a kernel for).
_INPLACE_OPS: Mapping[tuple[str, str], tuple[int, frozenset[int] | None]] = {
    **{("", op): (0, None) for op in (
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "HardSigmoid",
        "Softplus", "Softsign", "ThresholdedRelu", "Clip", "Cast", "Trilu", "ScatterElements",
    )},
    ("", "Softmax"): (0, _FLOAT_ONLY),
    ("", "LogSoftmax"): (0, _FLOAT_ONLY),
    (_MS_DOMAIN, "FusedConv"): (3, _FLOAT_ONLY),  # the residual Z, summed into the output
}

# Standard operators the CPU provider has no kernel for and runs as their ONNX function body:
# HardSwish as HardSigmoid then Mul, Mish as Softplus, Tanh, Mul. Measured: one intermediate
# of the output's size besides the input and output (the body's in-place steps share it).
_FUNCTION_EXPANDED_OPS = frozenset({"HardSwish", "Mish"})

# MLAS_SGEMM_STRIDEN * MLAS_SGEMM_STRIDEK floats: the im2col tile of one thread.
_MLAS_CONV_TILE_BYTES = 128 * 128 * 4


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
                   order: Sequence[int] | None = None) -> MemoryProfile:
    """Walk the top-level graph once and account every activation's lifetime.

    shapes: sizes at the user's bindings. symbolic_shapes: the model's shapes with no dim bound,
    as onnxruntime's planner compares them; inferred from `model` when not given.
    extra_weights: graph inputs to treat as weights (initializers set aside as input defaults).
    absent: tensors that take no memory, for "what if these intermediates did not exist".
    order: the nodes run in this order (indices into graph.node, a topological order) instead of
    onnxruntime's: what another stored order, or a runtime that follows the stored order, would do.
    Raises ValueError when the graph has a cycle or `order` is not a topological order.
    """
    return profile_memory_at(model, (shapes,), extra_weights=extra_weights, absent=absent,
                             symbolic_shapes=symbolic_shapes, order=order)[0]


def profile_memory_at(model: onnx.ModelProto, tables: Sequence[ShapeTable], *, extra_weights: Iterable[str] = (),
                      absent: Iterable[str] = (), symbolic_shapes: ShapeTable | None = None,
                      order: Sequence[int] | None = None) -> tuple[MemoryProfile, ...]:
    """profile_memory at each of several shape settings (`tables`): the buffer plan reads no
    sizes, so one walk serves them all."""
    with paused_gc():
        setup = _setup(model, symbolic_shapes, extra_weights, order)
        absent = frozenset(absent)
        plan = setup.plan(absent)
        return tuple(_profile(setup, plan, setup.sized(shapes), absent) for shapes in tables)


def _profile(setup: _Setup, plan: _Plan, sized: _Sized, absent: frozenset[str]) -> MemoryProfile:
    graph = setup.graph
    labels, producer = setup.labels, setup.producer
    if absent:
        known = {name: 0 if name in absent else size for name, size in sized.known.items()}
        unknown = tuple(name for name in sized.unknown if name not in absent)
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


def _held_across_peak(setup: _Setup, plan: _Plan, alive: list[int], peak_step: int, known: Mapping[str, int],
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


@dataclass
class _Sized:
    """What a model's walk needs from one shape table. held_workspace: the scratch of the steps
    whose kernel needs more when the plan writes its output into a held buffer (variadic ops)."""

    known: dict[str, int]
    unknown: tuple[str, ...]
    workspace: list[int]
    weight_bytes: int
    held_workspace: dict[int, int] = field(default_factory=dict)
    bodies: tuple[BodyCost, ...] = ()


@dataclass
class _Graph:
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
    reads: list[tuple[str, ...]]
    inputs: list[tuple[str, ...]]
    outputs: list[tuple[str, ...]]
    alias: list[bool]                    # output 0 is a view of input 0 (_ALIAS_OPS)
    in_place: list[tuple | None]         # the node's _INPLACE_OPS rule
    activations: set[str]                # graph inputs and node outputs that are not weights
    planner_shapes: dict[str, TensorInfo]
    planner_keys: dict[str, tuple | None]
    opset: int
    count: Counter[str]                  # the planner's static reference counts (see _Planner)
    graph_inputs: list[str]
    graph_outputs: set[str]
    # What sizing needs, copied out: nodes with kernel scratch (by stored index), resident weight
    # bytes, and each Constant's output with its `value` size for when the table has none.
    scratch_nodes: list[tuple[int, onnx.NodeProto]]
    initializer_bytes: int
    constants: list[tuple[str, int | None]]
    body_scope: Scope = field(default_factory=Scope)  # what control-flow nodes take from the graph
    runtime: _Setup | None = None        # onnxruntime's order
    explicit: _Setup | None = None       # the last order given (a scheduler's candidate)
    by_table: dict[int, tuple[ShapeTable, tuple]] = field(default_factory=dict)

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
        scratch = {stored: size for stored, node in self.scratch_nodes
                   if (size := _workspace_bytes(node, shapes, self.opset))}
        held_scratch = {stored: size for stored, node in self.scratch_nodes if _is_variadic(node)
                        and (size := _variadic_workspace(node, shapes, output_held=True)) != scratch.get(stored, 0)}
        # A body's walk is its node's scratch; the outputs it sizes where the table could not.
        costs = [(stored, cost) for stored, node in self.scratch_nodes if (_domain(node), node.op_type) in CONTROL_FLOW_OPS
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
class _Setup:
    """One model in one execution order (`order`: stored indices by step): what its walks share
    at every shape table and every `absent`."""

    graph: _Graph
    order: list[int]
    labels: list[str]
    producer: dict[str, str]             # in order of birth: graph inputs, then by step
    last_read: dict[str, int]
    by_table: dict[int, tuple[ShapeTable, _Sized]] = field(default_factory=dict)
    # The buffer plan reads planner shapes only, never sizes: one per `absent`, shared by every
    # shape setting. The plain one is kept; of the audit's growing `absent` sets, the last.
    plans: dict[frozenset[str], _Plan] = field(default_factory=dict)

    def sized(self, shapes: ShapeTable) -> _Sized:
        held = self.by_table.get(id(shapes))
        if held is not None and held[0] is shapes:
            return held[1]
        known, scratch, weight_bytes, held_scratch, bodies = self.graph.sized(shapes)
        workspace = [0] * len(self.labels)
        if scratch:
            for step, stored in enumerate(self.order):
                workspace[step] = scratch.get(stored, 0)
        held_workspace = ({step: held_scratch[stored] for step, stored in enumerate(self.order) if stored in held_scratch}
                          if held_scratch else {})
        unknown = () if len(known) == len(self.producer) else tuple(name for name in self.producer if name not in known)
        result = _Sized(known, unknown, workspace, weight_bytes, held_workspace, bodies)
        self.by_table[id(shapes)] = (shapes, result)  # the table is held: its id stays its own
        return result

    def plan(self, absent: frozenset[str]) -> _Plan:
        plan = self.plans.get(absent)
        if plan is None:
            plan = _Planner(self, set(absent)).run()
            if absent:
                self.plans = {key: kept for key, kept in self.plans.items() if not key}
            self.plans[absent] = plan
        return plan


# The last few models walked. A model is recognised by identity and by a fingerprint of its nodes
# and names (a model edited in place is set up again); its tables are immutable.
_GRAPHS: list[_Graph] = []
_GRAPHS_KEPT = 4


def _setup(model: onnx.ModelProto, symbolic_shapes: ShapeTable | None, extra_weights: Iterable[str],
           explicit: Sequence[int] | None = None) -> _Setup:
    # A list: indexing a protobuf repeated field builds a wrapper per access (35 us at 12k nodes).
    stored = list(model.graph.node)
    serialized = [node.SerializeToString() for node in stored]
    extra = frozenset(extra_weights)
    fingerprint = model_fingerprint(model, extra=extra, serialized=serialized)
    # An id is reused once its model is gone; the fingerprint then says whether the new model has
    # the same structure, for which the setup holds as well.
    graph = next((g for g in _GRAPHS if g.model_id == id(model) and g.symbolic is symbolic_shapes
                  and g.fingerprint == fingerprint), None)
    if graph is None:
        graph = _graph(model, _nodes(stored, serialized), symbolic_shapes, extra, fingerprint)
        _GRAPHS.insert(0, graph)
        del _GRAPHS[_GRAPHS_KEPT:]
    if explicit is None:
        if graph.runtime is None:
            graph.runtime = _ordered(graph, _runtime_order(graph.producers))
        return graph.runtime
    wanted = list(explicit)
    if graph.explicit is None or graph.explicit.order != wanted:
        # a scheduler's candidate, judged at each shape setting in turn: the last one kept
        graph.explicit = _ordered(graph, _checked_order(wanted, graph.producers, graph.labels))
    return graph.explicit


def _graph(model: onnx.ModelProto, nodes: Sequence[_Node], symbolic_shapes: ShapeTable | None,
           extra: frozenset[str], fingerprint: bytes) -> _Graph:
    graph = model.graph
    consumed = [node.consumed for node in nodes]
    outputs = [node.output for node in nodes]
    labels = [node.name or node_label(node, index) for index, node in enumerate(nodes)]  # a call only when unnamed
    producers = _producers(outputs, consumed)
    if all(j < i for i, sources in enumerate(producers) for j in sources):
        order = list(range(len(nodes)))  # stored in order: what execution_order returns
    else:
        order = execution_order(graph, consumed, outputs)  # the one place that reports a cycle
    symbolic = symbolic_shapes if symbolic_shapes is not None else infer_shapes(model)
    weights = _weight_names(graph, nodes) | extra
    graph_inputs = [vi.name for vi in graph.input if vi.name and vi.name not in weights]
    activations = set(itertools.chain.from_iterable(outputs))
    activations -= weights
    activations.discard("")
    activations.update(graph_inputs)
    reads = [node.reads for node in nodes]
    # Planner shapes depend on the nodes, not on the order they run in (any topological order
    # propagates the same dims).
    ordered = [nodes[i] for i in order]
    planner = _planner_shapes(ordered, _without_data_propagation(model, ordered, symbolic), _declared_dims(graph))
    keys = _planner_keys(activations, planner)
    opset = _default_opset(model)
    kinds = [node.kind for node in nodes]
    graph_outputs = {vi.name for vi in graph.output}
    count = Counter(itertools.chain(graph_inputs, itertools.chain.from_iterable(reads),
                                    itertools.chain.from_iterable(outputs), graph_outputs))
    initializer_bytes = _initializer_bytes(graph.initializer) + sum(
        (_tensor_nbytes(t.values) or 0) + (_tensor_nbytes(t.indices) or 0) for t in graph.sparse_initializer)
    return _Graph(
        model_id=id(model), symbolic=symbolic_shapes, fingerprint=fingerprint, labels=labels,
        op_types=[node.op_type for node in nodes], producers=producers, reads=reads,
        inputs=[node.input for node in nodes], outputs=outputs,
        alias=[kind in _ALIAS_OPS and _ALIAS_OPS[kind][0] <= opset <= _ALIAS_OPS[kind][1] for kind in kinds],
        in_place=[_INPLACE_OPS.get(kind) for kind in kinds], activations=activations, planner_shapes=planner,
        planner_keys=keys, opset=opset, count=count, graph_inputs=graph_inputs, graph_outputs=graph_outputs,
        scratch_nodes=[(i, _detached(node.proto)) for i, (kind, node) in enumerate(zip(kinds, nodes))
                       if kind in _SCRATCH_OPS or kind in CONTROL_FLOW_OPS],
        body_scope=scope(graph, [node.proto for node in nodes if node.kind in CONTROL_FLOW_OPS]),
        initializer_bytes=initializer_bytes,
        constants=[(node.output[0], _constant_value_bytes(node.proto)) for node in nodes
                   if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS and node.output])


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
            kind = ("" if domain in _DEFAULT_DOMAINS else domain, op_type)  # (_domain, op_type)
            fields = _NODE_FIELDS[key] = (proto.name, op_type, domain, inputs, tuple(proto.output),
                                          tuple(consumed), reads, kind)
        nodes.append(_Node(proto, fields))
    return nodes


def _ordered(graph: _Graph, order: list[int]) -> _Setup:
    labels = [graph.labels[i] for i in order]
    producer = dict.fromkeys(graph.graph_inputs, INPUT_PRODUCER)
    activations = graph.activations
    for i, label in zip(order, labels):
        for name in graph.outputs[i]:
            if name in activations:
                producer[name] = label
    last_read = {name: step for step, i in enumerate(order) for name in graph.reads[i]}
    return _Setup(graph, order, labels, producer, last_read)


def _checked_order(order: Sequence[int], producers: Sequence[Sequence[int]], labels: Sequence[str]) -> list[int]:
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




def runtime_order(graph: onnx.GraphProto) -> list[int]:
    """Indices into `graph.node` in onnxruntime's default execution order (see the module
    docstring). Iterative: graphs reach 10k+ nodes. Assumes an acyclic graph."""
    return _runtime_order(_producers([node.output for node in graph.node], [consumed_names(node) for node in graph.node]))


def runtime_order_of(nodes: Sequence[onnx.NodeProto], consumed: Sequence[set[str]]) -> list[int]:
    """onnxruntime's order of `nodes` stored as listed (each node's consumed_names given): what a
    scheduler's candidate stored order would run as."""
    return _runtime_order(_producers([node.output for node in nodes], consumed))


# What a scheduler needs of the kernel rules above, so that its own sizing follows this model.

def weight_names(graph: onnx.GraphProto) -> set[str]:
    """Initializers and Constant outputs: resident, never counted as activations."""
    return _weight_names(graph)


def is_view(node: onnx.NodeProto, opset: int) -> bool:
    """Output 0 is a view of input 0 (an Alias kernel): no bytes of its own."""
    rule = _ALIAS_OPS.get((_domain(node), node.op_type))
    return rule is not None and rule[0] <= opset <= rule[1]


def in_place_input(node: onnx.NodeProto) -> int | None:
    """The input whose buffer a MayInplace kernel may write its output into, or None."""
    rule = _INPLACE_OPS.get((_domain(node), node.op_type))
    return None if rule is None else rule[0]


def workspace_bytes(node: onnx.NodeProto, shapes: ShapeTable, opset: int) -> int:
    """The kernel's scratch while it runs (see "Workspace" in the module docstring)."""
    return _workspace_bytes(node, shapes, opset)


def _producers(outputs: Sequence[Sequence[str]], consumed: Sequence[Iterable[str]]) -> list[tuple[int, ...]]:
    """Each node's producers, ascending, from each one's outputs and consumed_names."""
    producer = {name: i for i, names in enumerate(outputs) for name in names if name}
    return [tuple(sorted({producer[n] for n in names if n in producer})) for names in consumed]


def _runtime_order(producers: Sequence[Sequence[int]]) -> list[int]:
    """onnxruntime's order of nodes given as each one's producers (_producers)."""
    read = [False] * len(producers)
    for sources in producers:
        for i in sources:
            read[i] = True
    stack = [(i, False) for i in range(len(producers)) if not read[i]]
    visited = [False] * len(producers)
    order: list[int] = []
    while stack:
        i, leaving = stack.pop()
        if leaving:
            order.append(i)
        elif not visited[i]:
            visited[i] = True
            stack.append((i, True))
            # Pushed in ascending index order, so the highest-index producer is visited first.
            stack.extend((j, False) for j in producers[i] if not visited[j])
    return order


@dataclass
class _Plan:
    """The buffers of one walk, as parallel lists by buffer index (in order of allocation): the
    first tenant (who sized it), the step it is allocated at, the step after which it is
    released; and every tenant with its buffer, in order of birth."""

    views: set[str]                 # Alias outputs: a view of their input, nothing written
    birth: dict[str, int]
    birth_rank: dict[str, int]
    first: list[str]
    births: np.ndarray
    deaths: np.ndarray
    tenants: list[str]
    tenant_buffers: list[int]
    # what the nodes write, by step (views write nothing): each tensor and its node's op_type,
    # in two lists, not a pair each (fewer objects for the garbage collector to look at)
    write_ops: list[str]
    writes: list[str]
    # the steps whose first output went into a buffer allocated before (reused or in place)
    held_outputs: set[int] = field(default_factory=set)

    def occupants(self, buffers: set[int], step: int) -> dict[int, str]:
        """Each of `buffers`' tenant at `step`: the last one born by then."""
        occupant: dict[int, str] = {}
        birth = self.birth
        for name, buffer in zip(self.tenants, self.tenant_buffers):
            if buffer in buffers and birth[name] <= step:
                occupant[buffer] = name
        return occupant


@dataclass
class _Planner:
    """onnxruntime's single-stream reuse plan (allocation_planner.cc), replayed on names.

    `count` holds the planner's static reference counts per tensor: one per read (with
    multiplicity), one for the definition, one more for graph inputs and outputs (the caller's
    use). A buffer's `uses` sums its tenants' and drops by one per read and definition passed,
    so it reaches 0 exactly when the planner puts the buffer on its free list. Buffers are
    indices into parallel lists, not objects: a walk of 12k nodes makes 8k of them.
    """

    setup: _Setup
    absent: set[str]
    buffer_of: dict[str, int] = field(default_factory=dict)
    free: dict[tuple, list[int]] = field(default_factory=dict)
    count: Mapping[str, int] = field(default_factory=dict)
    keys: Mapping[str, tuple | None] = field(default_factory=dict)
    uses: list[int] = field(default_factory=list)
    first: list[str] = field(default_factory=list)
    born: list[int] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    tenant_buffers: list[int] = field(default_factory=list)

    def run(self) -> _Plan:
        setup, graph = self.setup, self.setup.graph
        reads, count, keys, activations = graph.reads, graph.count, graph.planner_keys, graph.activations
        self.count, self.keys = count, keys
        last = len(setup.labels) - 1
        graph_inputs, graph_outputs = graph.graph_inputs, graph.graph_outputs
        views: set[str] = set()
        weight_views: set[str] = set()  # views of weights: no activation bytes at all
        birth: dict[str, int] = {}
        buffer_of_get, keys_get, free, uses, first = self.buffer_of.get, keys.get, self.free, self.uses, self.first
        born, tenants, tenant_buffers = self.born, self.tenants, self.tenant_buffers
        held_outputs: set[int] = set()
        for name in graph_inputs:
            birth[name] = 0
            if name not in self.absent:
                self._new(name, 0)
        absent, buffer_of = self.absent, self.buffer_of
        all_inputs, all_outputs, alias, in_place = graph.inputs, graph.outputs, graph.alias, graph.in_place
        for step, i in enumerate(setup.order):
            inputs, outputs = all_inputs[i], all_outputs[i]
            for index, name in enumerate(outputs):
                if name not in activations:
                    continue
                birth[name] = step
                if name in absent:
                    continue
                if name in graph_outputs:
                    self._new(name, step)
                    continue
                source = inputs[0] if inputs else ""
                if index == 0 and alias[i] and source:
                    if source in buffer_of:
                        views.add(name)
                        self._join(buffer_of[source], name)
                        continue
                    if source not in activations or source in weight_views:
                        views.add(name)
                        weight_views.add(name)
                        continue
                shared = self._in_place(in_place[i], inputs, name) if index == 0 and in_place[i] is not None else None
                if shared is None:
                    # a dead buffer of the same planner shape, the last freed first (FindReusableTensor)
                    key = keys_get(name)
                    stack = free.get(key) if key is not None else None
                    shared = stack.pop() if stack else None
                if shared is not None:
                    self._join(shared, name)
                    if index == 0:
                        held_outputs.add(step)
                else:  # _new, inlined: once per buffer (12k nodes: 8k times a walk)
                    buffer_of[name] = buffer = len(first)
                    first.append(name)
                    born.append(step)
                    uses.append(count[name])
                    tenants.append(name)
                    tenant_buffers.append(buffer)
            # a release, inlined: it runs once per read and per output (12k nodes: 27k times a walk)
            for name in itertools.chain(reads[i], outputs):
                buffer = buffer_of_get(name)
                if buffer is None:
                    continue
                uses[buffer] -= 1
                if not uses[buffer]:
                    key = keys_get(first[buffer])
                    if key is not None and key[1]:  # scalars are never reused
                        free.setdefault(key, []).append(buffer)

        # Released after the last read of any tenant; the caller's inputs and outputs, and
        # tensors nobody reads (no release action is planned for them), stay to the end.
        last_read = setup.last_read
        held = graph_outputs | set(graph_inputs)
        deaths = [-1] * len(first)
        for name, buffer in zip(self.tenants, self.tenant_buffers):
            step = last if name in held else last_read.get(name, last)
            if step > deaths[buffer]:
                deaths[buffer] = step
        rank = {name: i for i, name in enumerate(birth)}
        written = [(i, name) for i in setup.order for name in graph.outputs[i] if name in activations and name not in views]
        return _Plan(views, birth, rank, first, np.array(self.born, dtype=np.int64), np.array(deaths, dtype=np.int64),
                     self.tenants, self.tenant_buffers, [graph.op_types[i] for i, _ in written],
                     [name for _, name in written], held_outputs)

    def _new(self, name: str, step: int) -> None:
        buffer = len(self.first)
        self.first.append(name)
        self.born.append(step)
        self.uses.append(self.count[name])
        self.buffer_of[name] = buffer
        self.tenants.append(name)
        self.tenant_buffers.append(buffer)

    def _join(self, buffer: int, name: str) -> None:
        self.uses[buffer] += self.count[name]
        self.buffer_of[name] = buffer
        self.tenants.append(name)
        self.tenant_buffers.append(buffer)

    def _in_place(self, rule: tuple[int, frozenset[int] | None] | None, inputs: Sequence[str],
                  name: str) -> int | None:
        """The input buffer a MayInplace kernel computes this output in, if the planner allows."""
        if rule is None or len(inputs) <= rule[0]:
            return None
        source, types = rule
        buffer = self.buffer_of.get(inputs[source])
        if buffer is None or self.uses[buffer] != 1:
            return None  # read again later, or the caller's: not the last use
        info = self.setup.graph.planner_shapes.get(inputs[source])
        if types is not None and (info is None or info.elem_type not in types):
            return None
        key = self.keys.get(inputs[source])
        return buffer if key is not None and key == self.keys.get(name) else None


# Operators whose inference broadcasts its inputs' dims (onnx's multidirectional broadcasting).
_BROADCAST_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater",
    "GreaterOrEqual", "Less", "LessOrEqual", "Where", "Max", "Min", "Sum", "Mean", "PRelu",
    "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})


def planner_shapes(model: onnx.ModelProto, symbolic: ShapeTable | None = None) -> dict[str, TensorInfo]:
    """Every top-level tensor's shape as onnxruntime's allocation planner compares it (see the
    module docstring); `symbolic`: infer_shapes(model) when the caller has it."""
    graph = model.graph
    stored = list(graph.node)
    nodes = [stored[i] for i in execution_order(graph)]
    symbolic = symbolic if symbolic is not None else infer_shapes(model)
    return _planner_shapes(nodes, _without_data_propagation(model, nodes, symbolic), _declared_dims(graph))


def _declared_dims(graph: onnx.GraphProto) -> dict[str, tuple[bool, ...]]:
    """Per tensor the model declares a shape for (value_info, graph outputs): which dims it
    names or gives a value."""
    declared = {}
    for vi in (*graph.value_info, *graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            declared[vi.name] = tuple(d.HasField("dim_value") or bool(d.dim_param) for d in vi.type.tensor_type.shape.dim)
    return declared


def _planner_shapes(nodes: Sequence[onnx.NodeProto], symbolic: ShapeTable,
                    declared: Mapping[str, tuple[bool, ...]]) -> dict[str, TensorInfo]:
    """Shapes as onnxruntime's own graph inference leaves them (see "Shapes" in the module
    docstring): `symbolic`, less what onnx's placeholders added, redone downstream of every
    tensor that changed, except the dims the model declares."""
    shapes = dict(symbolic.tensors)
    raw = symbolic.placeholders
    changed: set[str] = set()
    for node in nodes:
        touched = bool(changed) and any(name in changed for name in node.input)
        for name in node.output:
            info = shapes.get(name)
            if info is None or info.shape is None or (name not in raw and not touched):
                continue
            kept = declared.get(name)
            if kept is not None and (len(kept) != len(info.shape) or all(kept)):
                continue
            if name in raw and raw[name] is None:
                dims = None
            else:
                placeholders = raw.get(name) or (None,) * len(info.shape)
                dims = _runtime_dims(node, placeholders, info.shape, shapes, raw, touched)
                if kept is not None:
                    dims = tuple(d if keep else new for d, new, keep in zip(info.shape, dims, kept))
            if dims != info.shape:
                changed.add(name)
                shapes[name] = TensorInfo(name, info.elem_type, dims)
    return shapes


# Operators whose output shape is read from the values of an input (its index): where that
# input is computed at run time, onnx's data propagation names the output's dims and
# onnxruntime's inference does not.
SHAPE_VALUE_INPUT: Mapping[str, int] = MappingProxyType({
    "Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Slice": 2, "Range": 1, "Resize": 3,
})


def _without_data_propagation(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
                              symbolic: ShapeTable) -> ShapeTable:
    """`symbolic` with the dims onnx's data propagation named, and onnxruntime's inference does
    not, marked as placeholders (so `_planner_shapes` redoes them): onnx inferred once more without
    data propagation, only when some shape is read from a value computed at run time."""
    shape_inputs = {node.input[index] for node in nodes
                    if (index := SHAPE_VALUE_INPUT.get(node.op_type)) is not None and len(node.input) > index
                    and _domain(node) == ""}
    if shape_inputs:  # computed: written by a node, not a Constant
        shape_inputs &= set(itertools.chain.from_iterable(node.output for node in nodes))
        shape_inputs -= {name for node in nodes if node.op_type == "Constant" and _domain(node) == ""
                         for name in node.output}
    if not shape_inputs:
        return symbolic
    plain = infer_shapes(model, data_propagation=False)
    placeholders = dict(symbolic.placeholders)
    for name, raw in plain.placeholders.items():
        info = symbolic.get(name)
        # The run's own unk__N names, kept apart from those of the table's inference.
        placeholders[name] = None if raw is None else tuple(None if r is None else f"~{r}" for r in raw)
        if info is not None and info.shape is not None and raw is not None and len(raw) != len(info.shape):
            placeholders[name] = None
    return dataclasses.replace(symbolic, placeholders=MappingProxyType(placeholders))


def _runtime_dims(node: onnx.NodeProto, raw: tuple, known: tuple, shapes: Mapping[str, TensorInfo],
                  raw_of: Mapping[str, tuple], touched: bool) -> tuple:
    """One output's dims as onnxruntime infers them: where onnx wrote a placeholder (or, when an
    input changed, a name), what the operator's inference makes of its inputs' dims as
    onnxruntime sees them."""
    inputs = None   # (shape info, placeholders) of each input, read on first need
    passed = None   # each input placeholder's dim as onnxruntime sees it, the first input's first
    rank = len(known)
    dims = list(known)
    op = node.op_type if _domain(node) == "" else ""
    for index, (dim, placeholder) in enumerate(zip(known, raw)):
        if placeholder is None and (not touched or not isinstance(dim, str)):
            continue
        if inputs is None:
            inputs = [(shapes.get(i), raw_of.get(i)) for i in node.input if i]
        if placeholder is None:
            if op not in _BROADCAST_OPS and op != "Concat" and not (op == "MatMul" and index < rank - 2):
                # A name survives only where an input still carries it.
                carried = any(info is not None and info.shape is not None and dim in info.shape for info, _ in inputs)
                dims[index] = dim if carried else None
                continue
        if op in _BROADCAST_OPS or op == "MatMul" and index < rank - 2:
            aligned = [info.shape[len(info.shape) - rank + index] for info, _ in inputs
                       if info is not None and info.shape is not None and len(info.shape) >= rank - index
                       and (op != "MatMul" or len(info.shape) - rank + index < len(info.shape) - 2)]
            dims[index] = _broadcast_dim(aligned)
        elif op == "Concat":
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % max(rank, 1)
            ranked = [info.shape for info, _ in inputs if info is not None and info.shape is not None
                      and len(info.shape) == rank]
            dims[index] = None if index == axis else _first_known(shape[index] for shape in ranked)
        else:  # a dim passed through: the input dim onnx copied it from
            if passed is None:
                passed = {}
                for info, source in inputs:
                    if info is not None and source is not None and info.shape is not None \
                            and len(info.shape) == len(source):
                        for d, value in zip(source, info.shape):
                            passed.setdefault(d, value)
            dims[index] = passed.get(placeholder)
    return tuple(dims)


def _broadcast_dim(dims: Sequence) -> int | str | None:
    """onnx's multidirectional broadcasting of one axis, with None for a dim nothing names."""
    value, names = 1, set()
    for d in dims:
        if isinstance(d, int):
            value = d if d != 1 else value
        else:
            names.add(d)
    if value != 1 or not names:
        return value
    return names.pop() if len(names) == 1 else None


def _first_known(dims: Iterable) -> int | str | None:
    """onnx's mergeInDimensionInfo over several inputs: a value wins, else the first name."""
    name = None
    for d in dims:
        if isinstance(d, int):
            return d
        if name is None and d is not None:
            name = d
    return name


def _planner_key(info: TensorInfo | None) -> tuple | None:
    """What the planner's SameSize compares: element size and shape, no dim bound. None when it
    matches nothing: unknown rank or type, a string, a dim shape inference could not name."""
    if info is None or info.shape is None or any(d is None for d in info.shape):
        return None
    bits = element_size_bits(info.elem_type)  # None for strings, which are never reused
    return None if bits is None else (bits, info.shape)


def _planner_keys(names: Iterable[str], planner: Mapping[str, TensorInfo]) -> dict[str, tuple | None]:
    """_planner_key of each name, computed once per distinct (type, shape): a few hundred at 12k nodes."""
    by_shape: dict[tuple, tuple | None] = {}
    keys: dict[str, tuple | None] = {}
    for name in names:
        info = planner.get(name)
        if info is None:
            keys[name] = None
            continue
        shape = (info.elem_type, info.shape)
        if shape not in by_shape:
            by_shape[shape] = _planner_key(info)
        keys[name] = by_shape[shape]
    return keys


def _reads(inputs: Sequence[str], consumed: set[str]) -> list[str]:
    """What the planner counts as a node's reads: each explicit input occurrence, then each name
    its subgraphs take from the enclosing scope (`consumed` less the explicit inputs)."""
    explicit = [name for name in inputs if name]
    return explicit + sorted(consumed - set(explicit))


def _domain(node: onnx.NodeProto) -> str:
    return "" if node.domain in _DEFAULT_DOMAINS else node.domain


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 0)


# (domain, op_type) of the nodes _workspace_bytes may give scratch to.
_SCRATCH_OPS = frozenset({
    ("", "Conv"), (_MS_DOMAIN, "FusedConv"), (_MS_DOMAIN, "BiasGelu"), (_MS_DOMAIN, "FastGelu"),
    ("", "HardSwish"), ("", "Mish"), ("", "Where"), ("", "LRN"), (_MS_DOMAIN, "MultiHeadAttention"), ("", "Dropout"),
    ("", "Sum"), ("", "Mean"), ("", "Max"), ("", "Min"),
    (_MS_DOMAIN, "GroupQueryAttention"), (_MS_DOMAIN, "Attention"), ("", "LSTM"),
})


def _workspace_bytes(node: onnx.NodeProto, shapes: ShapeTable, opset: int) -> int:
    """Scratch a kernel allocates while it runs (see the module docstring); 0 when unknown."""
    domain = _domain(node)
    if node.op_type == "Conv" and domain == "" or node.op_type == "FusedConv" and domain == _MS_DOMAIN:
        return _conv_workspace(node, shapes)
    if domain == _MS_DOMAIN and (node.op_type == "BiasGelu"
                                 or node.op_type == "FastGelu" and len(node.input) > 1 and node.input[1]):
        return shapes.nbytes(node.output[0]) or 0
    if domain == "" and node.op_type in _FUNCTION_EXPANDED_OPS:
        return shapes.nbytes(node.output[0]) or 0
    if domain == "" and node.op_type == "Where":
        return _where_workspace(node, shapes)
    if _is_variadic(node):
        return _variadic_workspace(node, shapes)
    if domain == "" and node.op_type == "LRN":
        return _lrn_workspace(node, shapes)
    if domain == _MS_DOMAIN and node.op_type == "MultiHeadAttention":
        return _attention_workspace(node, shapes)
    if domain == _MS_DOMAIN and node.op_type == "GroupQueryAttention":
        return _group_query_attention_workspace(node, shapes)
    if domain == _MS_DOMAIN and node.op_type == "Attention":
        return _packed_attention_workspace(node, shapes)
    if domain == "" and node.op_type == "LSTM":
        return _lstm_workspace(node, shapes)
    if node.op_type == "Dropout" and domain == "" and opset >= 12 and (len(node.output) < 2 or not node.output[1]):
        info = shapes.get(node.input[0])
        if info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape):
            return math.prod(info.shape)  # a bool per element
    return 0


def _where_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """Where's two selection tensors, in bytes; 0 when unknown."""
    infos = [shapes.get(name) for name in node.input[:3]]
    out = shapes.get(node.output[0])
    if len(infos) < 3 or out is None or any(i is None or i.shape is None or not all(isinstance(d, int) for d in i.shape)
                                            for i in infos):
        return 0
    bits = element_size_bits(out.elem_type)
    if bits is None or bits % 8:
        return 0
    condition = infos[0].shape
    return bits // 8 * sum(math.prod(_broadcast_static(condition, values.shape)) for values in infos[1:])


# Variadic elementwise kernels (UntypedBroadcastVariadic, element_wise_ops.cc): with more than two
# inputs each pair is combined into a temporary, the next input into another, the last into the output.
_VARIADIC_OPS = frozenset({"Sum", "Mean", "Max", "Min"})


def _is_variadic(node: onnx.NodeProto) -> bool:
    return _domain(node) == "" and node.op_type in _VARIADIC_OPS and len([i for i in node.input if i]) > 2


def _variadic_workspace(node: onnx.NodeProto, shapes: ShapeTable, *, output_held: bool = False) -> int:
    """The temporaries of Sum/Mean/Max/Min over n > 2 inputs, in bytes; 0 when unknown. Partial
    results p0 = in0 (+) in1, p1 = p0 (+) in2, ...; while p[i] is computed p[i-1] is alive, and the
    last partial is alive beside the output, which the kernel asks for last: the most of p[-1] and
    p[i-1] + p[i], less the output where the plan allocates it fresh (it is counted beside the
    scratch and takes p[0]'s place), in full where it is a buffer held before (output_held)."""
    infos = [shapes.get(name) for name in node.input if name]
    out = shapes.get(node.output[0])
    if out is None or out.shape is None or any(i is None or i.shape is None or not all(isinstance(d, int) for d in i.shape)
                                                for i in infos):
        return 0
    bits = element_size_bits(out.elem_type)
    if bits is None or bits % 8 or not all(isinstance(d, int) for d in out.shape):
        return 0
    partials, shape = [], infos[0].shape
    for info in infos[1:-1]:
        shape = _broadcast_static(shape, info.shape)
        partials.append(math.prod(shape))
    output = 0 if output_held else math.prod(out.shape)
    held = [partials[-1]] + [a + b - output for a, b in zip(partials, partials[1:])]
    return bits // 8 * max(0, *held)


def _broadcast_static(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def _lrn_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """LRN's scale (the input's size) and one image's padded squares, in bytes; 0 when unknown."""
    info = shapes.get(node.input[0])
    if (info is None or info.elem_type != TensorProto.FLOAT or info.shape is None or len(info.shape) != 4
            or not all(isinstance(d, int) for d in info.shape)):
        return 0
    size = next((a.i for a in node.attribute if a.name == "size"), 1)
    batch, channels, height, width = info.shape
    return 4 * (batch * channels + channels + size - 1) * height * width


def _conv_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """MlasConvPrepare's working buffer for one intra-op thread, in bytes."""
    x, w = (shapes.get(name) for name in (list(node.input) + ["", ""])[:2])
    y = shapes.get(node.output[0])
    infos = (x, w, y)
    if any(i is None or i.shape is None or not all(isinstance(d, int) for d in i.shape) for i in infos):
        return 0
    if x.elem_type != TensorProto.FLOAT or len(x.shape) < 3:
        return 0
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    spatial_in, spatial_out = x.shape[2:], y.shape[2:]
    rank = len(spatial_in)
    group = int(attrs.get("group", 1)) or 1
    kernel = list(attrs.get("kernel_shape") or w.shape[2:])
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    pads = _conv_pads(attrs, spatial_in, spatial_out, kernel, strides, dilations)
    channels, filters = x.shape[1] // group, w.shape[0] // group
    k = channels * math.prod(kernel)
    pixels = math.prod(spatial_out)
    if rank > 3:
        return 4 * k * pixels  # the generic im2col path
    if all(s == 1 for s in strides) and not any(pads):
        if k == channels:
            return 0  # pointwise: GEMM straight on the input
        if rank <= 2 and all(d == 1 for d in dilations) and channels == 1:
            # MLAS promotes 1-D to 2-D (height 1); a kernel spanning the input's width, or its
            # whole height with width 1, is a direct GEMM too.
            in2, k2 = ([1, *spatial_in], [1, *kernel]) if rank == 1 else (spatial_in, kernel)
            if k2[1] == in2[1] or (k2[0] == in2[0] and k2[1] == 1):
                return 0
    if filters > pixels:
        return 4 * k * pixels
    return _MLAS_CONV_TILE_BYTES


# MultiHeadAttention inputs that turn MlasFlashAttention off: key_padding_mask, attention_bias,
# past_key, past_value, past_sequence_length, cache_indirection.
_ATTENTION_UNFLASHED_INPUTS = range(4, 10)
_SC_LEVEL2_CACHE_SIZE = 191  # glibc's sysconf name; Python's os.sysconf does not list it


@functools.cache
def l2_cache_bytes() -> int:
    """The L2 cache size onnxruntime reads (sysconf(_SC_LEVEL2_CACHE_SIZE) on Linux); 0 when
    unknown, where its flash attention is off."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return max(0, int(libc.sysconf(_SC_LEVEL2_CACHE_SIZE)))
    except (OSError, AttributeError, ValueError):
        return 0


def flash_attention_buffer(query_length: int, kv_length: int, qk_head: int, v_head: int, threads: int = 1) -> int:
    """MlasFlashAttention's per-thread blocks, in floats (multihead_attention.cc): Bc rows of K/V
    so that the blocks fill 3/4 of the L2 cache, Br = min(Bc, qk_head + v_head) rows of Q, each
    capped by its sequence; per thread Br * (2 + Bc + v_head). 0 where flash does not run."""
    l2 = l2_cache_bytes()
    if l2 <= 0:
        return 0
    kv_rows = max(l2 // (4 * 4 * (qk_head + v_head)), 1)
    q_rows = min(kv_rows, qk_head + v_head, query_length)
    kv_rows = min(kv_rows, kv_length)
    return threads * q_rows * (2 + kv_rows + v_head)


def _attention_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """MultiHeadAttention's temp-space buffers on the CPU provider (one intra-op thread), in
    bytes; 0 when unknown. Q, K, V are copied head-major one after the other; with a bias, each
    that is longer than one position is first summed into a [B, S, D] temporary and transposed
    from it. Then either flash attention's per-thread blocks or the probabilities [B, N, S, T] and
    the output before its transpose. Checked against the allocator's exact count
    (tests/test_analysis_measure.py)."""
    inputs = list(node.input) + [""] * 10

    def static(name: str) -> tuple[int, ...] | None:
        info = shapes.get(name) if name else None
        if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
            return None
        return info.shape

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    heads = int(attrs.get("num_heads", 0))
    query, key, value = (static(name) for name in inputs[:3])
    info = shapes.get(inputs[0])
    bits = element_size_bits(info.elem_type) if info is not None else None
    if heads <= 0 or bits is None or query is None or len(query) != 3 or key is None or value is None:
        return 0  # packed QKV (5-D) has no CPU kernel; without key, nothing we can size
    size = bits // 8
    batch, sequence, hidden = query
    q = batch * sequence * hidden
    if len(key) == 3 and len(value) == 3:
        kv_length, v_hidden = key[1], value[2]
        k, v = batch * kv_length * hidden, batch * kv_length * v_hidden
        biased = bool(inputs[3])
        q_temp, k_temp, v_temp = (x if biased and length > 1 else 0
                                  for x, length in ((q, sequence), (k, kv_length), (v, kv_length)))
        copies = q + k + v
        transient = max(q + q_temp, q + k + k_temp, copies + v_temp)
        flash = (not any(inputs[i] for i in _ATTENTION_UNFLASHED_INPUTS)
                 and not any(node.output[1:]) and not int(attrs.get("unidirectional", 0))
                 and info.elem_type == TensorProto.FLOAT and l2_cache_bytes() > 0)
    elif len(key) == 4 and len(value) == 4:  # [B, N, L, H]: used in place, and never flash
        kv_length, v_hidden = key[2], value[1] * value[3]
        copies, flash = q, False
        transient = copies
    else:
        return 0
    if flash:
        extra = flash_attention_buffer(sequence, kv_length, hidden // heads, v_hidden // heads)
    else:
        past = static(inputs[6])
        total = kv_length + (past[2] if past is not None and len(past) == 4 else 0)
        extra = batch * heads * sequence * total + batch * sequence * v_hidden
    return size * max(transient, copies + extra)


def _packed_attention_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """The packed-QKV Attention's scratch on the CPU provider, in bytes; 0 when unknown: the
    projections [B, S, q+k+v] (one GEMM into a temp-space buffer, attention.cc), then, as
    MultiHeadAttention without flash (ApplyAttention), the probabilities [B, N, S, T] and the output
    before its transpose [B, S, v]. Measured on onnxruntime 1.31.1 with an attention_bias and no past
    (tests/test_analysis_measure.py)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    heads = int(attrs.get("num_heads", 0))
    x, weights = (shapes.get(name) for name in (list(node.input) + [""])[:2])
    if (heads <= 0 or x is None or weights is None or x.shape is None or weights.shape is None or len(x.shape) != 3
            or len(weights.shape) != 2 or not all(isinstance(d, int) for d in x.shape + weights.shape)):
        return 0
    bits = element_size_bits(x.elem_type)
    if bits is None or len(node.input) > 4 and node.input[4]:
        return 0  # a past: not what fuse emits, not measured
    batch, sequence, _ = x.shape
    packed = weights.shape[1]
    v_hidden = int(attrs["qkv_hidden_sizes"][2]) if attrs.get("qkv_hidden_sizes") else packed // 3
    return bits // 8 * batch * sequence * (packed + heads * sequence + v_hidden)


def _group_query_attention_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """GroupQueryAttention's scratch on the CPU provider, in bytes; 0 when unknown: a head-major
    query copy [B, N, S, H], present-sized K/V buffers [B, KV, T, H] each (the kernel builds them
    when the present outputs are not requested, and as much again when they are), and the
    probabilities [B, N, S, T], which only a causal kernel (causal=1, the default) returning its
    presents does without. Measured on onnxruntime 1.31.1 with an attention_bias and no past at
    B 2-64, S 64-512, N 4-16, KV 2-8, H 32-128, causal 0 and 1, with and without the present
    outputs: within 0.25 MiB of that sum (tests/test_analysis_measure.py). fuse emits causal=0
    (the graph's own mask is the bias): the probabilities are always there."""
    inputs = list(node.input) + [""] * 11
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    heads, kv_heads = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    query, key = shapes.get(inputs[0]), shapes.get(inputs[1])
    if (heads <= 0 or kv_heads <= 0 or query is None or key is None or query.shape is None or key.shape is None
            or len(query.shape) != 3 or len(key.shape) != 3 or not all(isinstance(d, int) for d in query.shape + key.shape)):
        return 0  # packed QKV, or sizes unknown
    bits = element_size_bits(query.elem_type)
    if bits is None:
        return 0
    batch, sequence, hidden = query.shape
    head_size = hidden // heads
    past = shapes.get(inputs[3])
    total = key.shape[1] + (past.shape[2] if past is not None and past.shape is not None and len(past.shape) == 4
                            and isinstance(past.shape[2], int) else 0)
    query_copy = batch * heads * sequence * head_size
    presents = 2 * batch * kv_heads * total * head_size
    causal = int(attrs.get("causal", 1))
    probabilities = 0 if causal and any(node.output[1:3]) else batch * heads * sequence * total
    return bits // 8 * (query_copy + presents + probabilities)


def _lstm_workspace(node: onnx.NodeProto, shapes: ShapeTable) -> int:
    """The float LSTM's buffers on the CPU provider (cpu/rnn/deep_cpu_lstm.cc), in bytes; 0 when
    unknown: per direction, the four gates of every step [S, B, 4H], three [B, H] states, and one
    more for each of Y_h and Y_c not requested (the kernel writes them anyway); bidirectional also
    reverses the input and output sequences. Measured on onnxruntime 1.31.1 (B 64-256, S 1-16,
    H 128-256, with and without initial states, each output alone and all three): within 0.15
    [B, H] of (4 S + 3 + outputs left out) per direction, bidirectional within 0.2."""
    x = shapes.get(node.input[0])
    if x is None or x.elem_type != TensorProto.FLOAT or x.shape is None or len(x.shape) != 3 \
            or not all(isinstance(d, int) for d in x.shape):
        return 0
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    hidden = int(attrs.get("hidden_size", 0))
    if hidden <= 0 or int(attrs.get("layout", 0)):
        return 0
    steps, batch, features = x.shape
    directions = 2 if attrs.get("direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    outputs = list(node.output) + ["", ""]
    states = 3 + (not outputs[1]) + (not outputs[2])
    reversed_sequences = steps * batch * (features + hidden) if directions == 2 else 0
    return 4 * (directions * batch * hidden * (4 * steps + states) + reversed_sequences)


def _conv_pads(attrs: Mapping, spatial_in: Sequence[int], spatial_out: Sequence[int],
               kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [
            max(0, (o - 1) * s + (k - 1) * d + 1 - i)
            for i, o, k, s, d in zip(spatial_in, spatial_out, kernel, strides, dilations)
        ]
    if auto_pad == "VALID":
        return [0] * len(spatial_in)
    return list(attrs.get("pads") or [0] * 2 * len(spatial_in))


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
