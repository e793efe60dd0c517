"""onnxruntime's allocation planner replayed on names: which buffer each activation takes, and
when each buffer is allocated and released.

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
   sees it (planner_shapes.py). Add, Sub, Mul, Div, Pow, Neg, Exp, Erf, Sqrt and Gelu declare no in-place on
   the CPU provider: measured, they always take another buffer;
4. a dead buffer of the same element size and planner shape, the most recently freed first
   (FindReusableTensor; never for a scalar);
5. a new buffer.
The planner compares shapes before any dim is bound: the model's own shapes (`symbolic_shapes`),
where `batch` equals `batch` but a dim that shape inference could not name (Reshape's -1 of a
symbolic input) equals nothing, so such tensors never share. Which kernels alias or compute in
place is in the operators' records (fuse_cli/ops/).

Lifetimes. A graph input belongs to the caller and is live for the whole run (kPreExisting, and
the caller holds it). A buffer is released after the last node that reads any tensor it held
(GenerateDeallocationPlan); one holding a graph output or a tensor nobody reads is held to the end
of the run. A dead buffer the planner hands to a later tensor is not released in between: its
bytes count from its first tenant's birth to its last tenant's death.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from fuse_cli.analysis.walk_setup import WalkSetup
from fuse_cli.ops import IN_PLACE, VIEW_OPSETS, domain_of


def buffer_plan(setup: WalkSetup, absent: frozenset[str]) -> BufferPlan:
    """The buffer plan of `setup`'s order with `absent` taking no memory, made once per `absent`."""
    found = setup.plans.get(absent)
    if found is None:
        found = _Planner(setup, set(absent)).run()
        if absent:
            setup.plans = {key: kept for key, kept in setup.plans.items() if not key}
        setup.plans[absent] = found
    return found


def is_view(node: onnx.NodeProto, opset: int) -> bool:
    """Output 0 is a view of input 0 (an Alias kernel): no bytes of its own."""
    rule = VIEW_OPSETS.get((domain_of(node), node.op_type))
    return rule is not None and rule[0] <= opset <= rule[1]


def in_place_input(node: onnx.NodeProto) -> int | None:
    """The input whose buffer a MayInplace kernel may write its output into, or None."""
    rule = IN_PLACE.get((domain_of(node), node.op_type))
    return None if rule is None else rule[0]


@dataclass
class BufferPlan:
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

    setup: WalkSetup
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

    def run(self) -> BufferPlan:
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
        written = [(i, name) for i in setup.order for name in graph.outputs[i]
                   if name in activations and name not in views]
        return BufferPlan(views, birth, rank, first, np.array(self.born, dtype=np.int64),
                          np.array(deaths, dtype=np.int64), self.tenants, self.tenant_buffers,
                          [graph.op_types[i] for i, _ in written], [name for _, name in written], held_outputs)

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

