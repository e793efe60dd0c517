"""Memory-aware node order: the same operators and values, stored in an order with a lower peak.

Why the order matters. Of two branches that meet in a Concat or an Add, the one run first keeps
its output alive while the other runs: running the branch with the larger transient first (and
the one leaving the smaller output) lowers the peak. Which order runs depends on the runtime:
- "stored": the runtime executes graph.node as stored (most runtimes);
- "onnxruntime": onnxruntime's DEFAULT order, a reverse depth-first walk from the nodes no node
  reads, visiting a node's producers highest stored index first (memory.py's `_runtime_order`).
  Only the stored indices steer it, and only among a node's producers;
- "both" (`--target onnx`): one stored order never worse under either rule.

Realising a walk in onnxruntime. A walk is given by a rank per node (lower: explored first); at
each node the unvisited producers are explored in rank order. onnxruntime explores the highest
index first, so the stored order is the post-order of the same walk with every sibling order
reversed (`_stored_for_walk`): a topological order in which, at each node, the producer to be
explored first stands last. Exact on trees and on branches that share only what every branch
has already visited (the fork's input); where two branches share an unvisited ancestor the
reversed walk may meet it first and onnxruntime then runs a slightly different order. So the
order judged is always `_runtime_order` replayed on the stored order, never the intended one.

Search. Candidates, each judged by the memory model itself (profile_memory's peak for
"onnxruntime"; the same planner replayed on the stored order for "stored"):
1. Liu's rule (Liu 1987, optimal post-order of a tree, the Sethi-Ullman idea for memory): at each
   node explore the producers by decreasing (subtree peak - output bytes). Subtree peaks are
   computed bottom-up, treating a tensor read by several nodes as already live (the fork's input
   is computed by whichever branch runs first and held by all). Linear time.
2. Serenity's dynamic program (Ahn et al., MLSys 2020) over the sets of nodes already run, for
   "stored" (any topological order): states with the same set are merged, keeping the lowest
   peak. Chains of single-reader, single-producer nodes run contiguously (one step of the
   program), so it is exact among such orders under the sizing model below, and only while no
   step holds more than `_BEAM_WIDTH` states; past that it keeps the lowest-peak states (a beam
   search) and is a heuristic. Skipped above `_DP_MAX_STEPS` steps or past the time cap.
3. The walk nearest each candidate (ranks = its positions), for "onnxruntime".
The sizing model of the search (not of the judge): activation bytes at the bound shapes, views
(Reshape and its kind) free, in-place kernels reuse their input's bytes when they read it last,
kernel scratch while the node runs; weights and graph inputs never count. The judge adds
onnxruntime's buffer reuse rules; a candidate is kept only if the judge's peak is lower than the
input order's, so the result is never worse than the input by the estimate.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from fuse_cli.analysis import memory
from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.order import consumed_names, execution_order
from fuse_cli.analysis.shapes import ShapeTable, infer_shapes

RULES = ("onnxruntime", "stored", "both")
_BEAM_WIDTH = 256
_DP_MAX_STEPS = 4000


@dataclass(frozen=True)
class Scheduled:
    """A reordered model and the estimated peaks (bytes) before and after, per rule judged."""

    model: onnx.ModelProto
    rule: str
    peak_before: dict[str, int]
    peak_after: dict[str, int]
    method: str       # which candidate won: "liu", "dp", "dp-beam", "local" (walk local search)
    exact: bool       # the dynamic program finished without dropping states


def schedule(model: onnx.ModelProto, shapes: ShapeTable, symbolic_shapes: ShapeTable | None = None, *,
             rule: str = "onnxruntime", time_cap_s: float = 10.0,
             extra_weights: Iterable[str] = ()) -> Scheduled | None:
    """A copy of `model` whose nodes are stored in an order with a lower estimated peak under
    `rule` (see the module docstring), or None when no candidate order lowers it (for "both":
    lowers it under one rule without raising it under the other). No operator, value or
    attribute changes. shapes: sizes at the bound dims; symbolic_shapes: as profile_memory takes
    them; extra_weights: graph inputs that are weights (initializers kept as input defaults)."""
    if rule not in RULES:
        raise ValueError(f"unknown schedule rule {rule!r}: one of {', '.join(RULES)}")
    deadline = time.monotonic() + time_cap_s
    symbolic = symbolic_shapes if symbolic_shapes is not None else infer_shapes(model)
    extra_weights = tuple(extra_weights)
    dag = _Dag(model, shapes, extra_weights)
    if len(dag.nodes) < 3:
        return None
    judge = _Judge(model, shapes, symbolic, extra_weights)
    rules = ("onnxruntime", "stored") if rule == "both" else (rule,)
    original = list(range(len(dag.nodes)))
    before = {r: judge.peak(original, r) for r in rules}

    # The cap, split: the dynamic program, then the local search over walks, then the judge.
    start = time.monotonic()
    candidates: dict[str, list[int]] = {"liu": dag.liu_walk()}
    exact = False
    found = dag.dynamic_program(start + 0.4 * time_cap_s)
    if found is not None:
        order, exact = found
        candidates["dp" if exact else "dp-beam"] = order
    stored_orders: list[tuple[str, list[int]]] = []
    if "onnxruntime" in rules:
        walks = {name: [node for node, _ in dag.walk(_ranks(order))] for name, order in candidates.items()}
        seed = min(walks, key=lambda name: dag.simulate(walks[name]))
        walks["local"] = dag.improve_walk(_ranks(walks[seed]), start + 0.7 * time_cap_s)
        stored_orders += [(name, dag.stored_for_walk(post)) for name, post in walks.items()]
    if "stored" in rules:
        stored_orders += list(candidates.items())

    best: tuple[tuple, str, list[int], dict[str, int]] | None = None
    for name, stored in stored_orders:
        if time.monotonic() > deadline and best is not None:
            break
        peaks = {r: judge.peak(stored, r) for r in rules}
        if any(peaks[r] > before[r] for r in rules) or all(peaks[r] == before[r] for r in rules):
            continue
        score = (max(peaks[r] / max(before[r], 1) for r in rules), sum(peaks.values()))
        if best is None or score < best[0]:
            best = (score, name, stored, peaks)
    if best is None:
        return None
    _, name, stored, peaks = best
    return Scheduled(_reordered(model, stored), rule, before, peaks, name, exact and name == "dp")


def _ranks(order: Sequence[int]) -> list[int]:
    rank = [0] * len(order)
    for position, i in enumerate(order):
        rank[i] = position
    return rank


def _reordered(model: onnx.ModelProto, stored: Sequence[int]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(model.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(nodes[i] for i in stored)
    return out


class _Judge:
    """The peak of a stored order under each rule, by the memory model (memory.py).

    "onnxruntime" is profile_memory itself on a weightless copy with the nodes reordered.
    "stored" replays the same allocation planner on the stored order: profile_memory always
    takes onnxruntime's order, so this uses its building blocks (memory.py's _Planner and kin;
    an `order=` parameter on profile_memory would replace them)."""

    def __init__(self, model: onnx.ModelProto, shapes: ShapeTable, symbolic: ShapeTable, extra_weights: tuple[str, ...]):
        self.light = onnx.ModelProto()
        self.light.CopyFrom(model)
        for tensor in self.light.graph.initializer:  # dims and type size the weights; payloads are not read
            tensor.ClearField("raw_data")
            for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                tensor.ClearField(field)
        self.nodes = list(self.light.graph.node)
        self.shapes, self.symbolic, self.extra_weights = shapes, symbolic, extra_weights
        self.consumed = [consumed_names(node) for node in self.nodes]

    def peak(self, stored: Sequence[int], rule: str) -> int:
        if rule == "onnxruntime":
            graph = self.light.graph
            del graph.node[:]
            graph.node.extend(self.nodes[i] for i in stored)
            return profile_memory(self.light, self.shapes, extra_weights=self.extra_weights,
                                  symbolic_shapes=self.symbolic).peak_bytes
        return self._stored_peak(stored)

    def _stored_peak(self, order: Sequence[int]) -> int:
        graph = self.light.graph
        nodes = [self.nodes[i] for i in order]
        weights = memory._weight_names(graph) | set(self.extra_weights)
        activations = {vi.name for vi in graph.input if vi.name and vi.name not in weights}
        activations |= {name for node in nodes for name in node.output if name and name not in weights}
        known = {name: size for name in activations if (size := self.shapes.nbytes(name)) is not None}
        opset = memory._default_opset(self.light)
        reads = [memory._reads(self.nodes[i], self.consumed[i]) for i in order]
        planner = memory._Planner(graph, nodes, reads, activations, set(),
                                  memory._planner_shapes(nodes, self.symbolic), opset)
        workspace = [memory._workspace_bytes(node, self.shapes, opset) for node in nodes]
        return max(memory._timeline(len(nodes), planner.run().buffers, known, workspace), default=0)


class _Dag:
    """The graph as the search sees it: node indices, producers and readers, and bytes."""

    def __init__(self, model: onnx.ModelProto, shapes: ShapeTable, extra_weights: tuple[str, ...]):
        graph = model.graph
        self.nodes = list(graph.node)
        consumed = [consumed_names(node) for node in self.nodes]
        execution_order(graph, consumed)  # raises on a cycle
        weights = memory._weight_names(graph) | set(extra_weights)
        opset = memory._default_opset(model)
        producer = {name: i for i, node in enumerate(self.nodes) for name in node.output if name}
        n = len(self.nodes)
        self.producers = [sorted({producer[t] for t in names if t in producer}) for names in consumed]
        self.readers: list[list[int]] = [[] for _ in range(n)]
        for i, sources in enumerate(self.producers):
            for j in sources:
                self.readers[j].append(i)
        held = {vi.name for vi in graph.output}
        # A view (Reshape and its kind) is its source's bytes: the buffer is the source's, read
        # by the readers of every view of it.
        self.buffer_of: dict[str, str] = {}
        for node in self.nodes:
            for k, name in enumerate(node.output):
                if not name or name in weights:
                    continue
                source = node.input[0] if node.input else ""
                alias = memory._ALIAS_OPS.get((memory._domain(node), node.op_type))
                if k == 0 and alias and alias[0] <= opset <= alias[1] and source:
                    self.buffer_of[name] = self.buffer_of.get(source, source) if source not in weights else ""
                else:
                    self.buffer_of[name] = name
        self.size = {b: shapes.nbytes(b) or 0 for b in set(self.buffer_of.values()) if b}
        self.graph_inputs = {vi.name for vi in graph.input}
        self.held = {self.buffer_of.get(name, name) for name in held}
        buffer_readers: dict[str, set[int]] = {}
        for i, names in enumerate(consumed):
            for t in names:
                b = self.buffer_of.get(t)
                if b:
                    buffer_readers.setdefault(b, set()).add(i)
        self.buffer_readers = buffer_readers
        self.writes = [[b for name in node.output if (b := self.buffer_of.get(name)) == name and b] for node in self.nodes]
        self.reads = [sorted({b for t in names if (b := self.buffer_of.get(t))}) for names in consumed]
        self.workspace = [memory._workspace_bytes(node, shapes, opset) for node in self.nodes]
        # The buffer an in-place kernel may write its output into (None: it never does).
        self.in_place: list[str | None] = []
        for node in self.nodes:
            rule = memory._INPLACE_OPS.get((memory._domain(node), node.op_type))
            source = node.input[rule[0]] if rule is not None and len(node.input) > rule[0] else ""
            self.in_place.append(self.buffer_of.get(source) if source else None)
        self.out_bytes = [sum(self.size.get(b, 0) for b in self.writes[i]) for i in range(n)]

    # --- walks (onnxruntime's rule) ------------------------------------------------------------

    def roots(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if not self.readers[i]]

    def walk(self, rank: Sequence[int]) -> list[tuple[int, list[int]]]:
        """The reverse depth-first walk exploring roots and producers by ascending rank: per
        node in post-order, the producers it explored, in order."""
        order = sorted(self.roots(), key=rank.__getitem__)
        visited = [False] * len(self.nodes)
        post: list[tuple[int, list[int]]] = []
        for root in order:
            visited[root] = True
            stack = [(root, iter(sorted(self.producers[root], key=rank.__getitem__)), [])]
            while stack:
                node, pending, explored = stack[-1]
                for j in pending:
                    if not visited[j]:
                        visited[j] = True
                        explored.append(j)
                        stack.append((j, iter(sorted(self.producers[j], key=rank.__getitem__)), []))
                        break
                else:
                    stack.pop()
                    post.append((node, explored))
        return post

    def stored_for_walk(self, post: Sequence[int]) -> list[int]:
        """A stored order onnxruntime's walk turns into the walk `post` (see the module
        docstring): the post-order of the walk with every sibling order, and the roots' order,
        reversed."""
        reverse_rank = [0] * len(self.nodes)
        for position, node in enumerate(post):
            reverse_rank[node] = -position
        return [node for node, _ in self.walk(reverse_rank)]

    def liu_walk(self) -> list[int]:
        """Liu's order (see the module docstring), as the walk's post-order."""
        n = len(self.nodes)
        peak = [0] * n
        for i in execution_order_of(self.producers):
            # A producer read by other nodes too is counted as live already (a fork's input).
            own = [j for j in self.producers[i] if len(self.readers[j]) == 1]
            own.sort(key=lambda j: peak[j] - self.out_bytes[j], reverse=True)
            running, best = 0, 0
            for j in own:
                best = max(best, running + peak[j])
                running += self.out_bytes[j]
            peak[i] = max(best, running + self.out_bytes[i] + self.workspace[i])
        rank = [0] * n
        for i in range(n):
            rank[i] = -(peak[i] - self.out_bytes[i])
        # Ties keep the stored order's preference: onnxruntime explores the higher index first.
        order = sorted(range(n), key=lambda i: (rank[i], -i))
        return [node for node, _ in self.walk(_ranks(order))]

    def simulate(self, order: Sequence[int]) -> int:
        """The search's peak of running `order` (the sizing model of the module docstring)."""
        position = _ranks(order)
        last: dict[str, int] = {}
        for b, readers in self.buffer_readers.items():
            if b not in self.held and b not in self.graph_inputs:
                last[b] = max(position[i] for i in readers)
        live = peak = 0
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

    def improve_walk(self, rank: list[int], deadline: float) -> list[int]:
        """Local search over walks: at each node reading several producers, try exploring each
        producer first; keep a change when the search's peak of the walk drops. Returns the
        best walk's post-order."""
        rank = list(rank)
        best_order = [node for node, _ in self.walk(rank)]
        best = self.simulate(best_order)
        joins = [i for i in range(len(self.nodes)) if len(self.producers[i]) > 1]
        improved = True
        while improved and time.monotonic() < deadline:
            improved = False
            for v in joins:
                for p in self.producers[v]:
                    if time.monotonic() > deadline:
                        return best_order
                    first = min(rank[j] for j in self.producers[v])
                    if rank[p] == first:
                        continue
                    trial = list(rank)
                    trial[p] = first - 1
                    order = [node for node, _ in self.walk(trial)]
                    peak = self.simulate(order)
                    if peak < best:
                        best, best_order, rank, improved = peak, order, trial, True
        return best_order

    # --- any topological order (the stored rule) -----------------------------------------------

    def dynamic_program(self, deadline: float) -> tuple[list[int], bool] | None:
        """Serenity's program over run sets (see the module docstring): (order, exact) or None
        when the graph is too big or the time ran out."""
        steps = self._chains()
        if len(steps) > _DP_MAX_STEPS:
            return None
        if len(steps) > _DP_MAX_STEPS // 4:
            deadline = min(deadline, time.monotonic() + (deadline - time.monotonic()) / 2)
        step_of = {}
        for s, members in enumerate(steps):
            for i in members:
                step_of[i] = s
        # Steps that compute from weights alone (ConstantOfShape, shape arithmetic: hundreds in
        # some exports) are no choice worth a state: each runs just before its first reader.
        glued = [False] * len(steps)
        step_preds: list[set[int]] = [set() for _ in steps]
        for s, members in enumerate(steps):
            step_preds[s] = {step_of[j] for i in members for j in self.producers[i] if step_of[j] != s}
            reads_input = any(b in self.graph_inputs for b in self.reads[members[0]])
            glued[s] = not reads_input and all(glued[t] for t in step_preds[s])
        preds = [0] * len(steps)
        succ: list[set[int]] = [set() for _ in steps]
        feeders: list[list[int]] = [[] for _ in steps]
        for s in range(len(steps)):
            if glued[s]:
                continue
            pending, seen = list(step_preds[s]), set()
            while pending:
                t = pending.pop()
                if t in seen:
                    continue
                seen.add(t)
                if glued[t]:
                    pending.extend(step_preds[t])
                else:
                    preds[s] |= 1 << t
                    succ[t].add(s)
            feeders[s] = sorted((t for t in seen if glued[t]), key=lambda t: steps[t][0])
        reader_mask = {b: sum(1 << step_of[i] for i in readers) for b, readers in self.buffer_readers.items()}
        start_ready = frozenset(s for s in range(len(steps)) if preds[s] == 0 and not glued[s])
        runnable = [s for s in range(len(steps)) if not glued[s]]
        # mask -> (peak, live, ready, order tuple as a linked list)
        layer: dict[int, tuple[int, int, frozenset[int], tuple | None]] = {0: (0, 0, start_ready, None)}
        exact = True
        width = _BEAM_WIDTH
        started = time.monotonic()
        for done_steps in range(len(runnable)):
            # Anytime: when the steps left would overrun the cap at this pace, keep fewer states
            # (down to one: greedy), so a big graph still gets an order.
            now = time.monotonic()
            if now > deadline:
                return None
            if done_steps and width > 1:
                pace = (now - started) / done_steps
                if now + pace * (len(runnable) - done_steps) > deadline:
                    width = max(1, width // 4)
            nxt: dict[int, tuple[int, int, frozenset[int], tuple | None]] = {}
            for mask, (peak, live, ready, trail) in layer.items():
                for s in ready:
                    run = [t for t in feeders[s] if not mask >> t & 1] + [s]
                    new = mask
                    for t in run:
                        new |= 1 << t
                    step_peak, new_live = self._run_step([i for t in run for i in steps[t]], live, new, reader_mask)
                    p = max(peak, step_peak)
                    old = nxt.get(new)
                    if old is None or (p, new_live) < old[:2]:
                        more = {t for t in succ[s] if preds[t] & ~new == 0}
                        path = trail
                        for t in run:
                            path = (t, path)
                        nxt[new] = (p, new_live, (ready - {s}) | more, path)
            if len(nxt) > width:
                exact = False
                nxt = dict(heapq.nsmallest(width, nxt.items(), key=lambda kv: kv[1][:2]))
            layer = nxt
        (_, (_, _, _, trail)), = layer.items()
        order_steps = []
        while trail is not None:
            order_steps.append(trail[0])
            trail = trail[1]
        order_steps.reverse()
        placed = set(order_steps)
        order_steps += [s for s in range(len(steps)) if s not in placed]  # constants nobody runnable reads
        return [i for s in order_steps for i in steps[s]], exact

    def _run_step(self, members: list[int], live: int, done: int, reader_mask: dict[str, int]) -> tuple[int, int]:
        peak = 0
        for i in members:
            alloc = self.out_bytes[i]
            freed = 0
            for b in self.reads[i]:
                if b in self.held or b in self.graph_inputs or reader_mask.get(b, 0) & ~done:
                    continue
                freed += self.size.get(b, 0)
            source = self.in_place[i]
            if (source and alloc and source not in self.held and source not in self.graph_inputs
                    and not reader_mask.get(source, 0) & ~done and self.size.get(source, 0) == alloc):
                alloc, freed = 0, freed - alloc  # the output takes its input's bytes
            peak = max(peak, live + alloc + self.workspace[i])
            live += alloc - freed
        return peak, live

    def _chains(self) -> list[list[int]]:
        """Steps of the program: maximal chains where each node has one producer, read only by
        the next (so running them back to back loses nothing a walk could do)."""
        n = len(self.nodes)
        head = [True] * n
        for i in range(n):
            if len(self.producers[i]) == 1:
                j = self.producers[i][0]
                if len(self.readers[j]) == 1:
                    head[i] = False
        steps = []
        for i in execution_order_of(self.producers):
            if head[i]:
                chain = [i]
                while len(self.readers[chain[-1]]) == 1 and not head[self.readers[chain[-1]][0]]:
                    chain.append(self.readers[chain[-1]][0])
                steps.append(chain)
        return steps


def execution_order_of(producers: Sequence[Sequence[int]]) -> list[int]:
    """A topological order of node indices given each node's producers (Kahn, lowest index
    first), for graphs whose stored order may not be topological."""
    n = len(producers)
    readers: list[list[int]] = [[] for _ in range(n)]
    pending = [len(p) for p in producers]
    for i, sources in enumerate(producers):
        for j in sources:
            readers[j].append(i)
    ready = [i for i in range(n) if not pending[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in readers[i]:
            pending[k] -= 1
            if not pending[k]:
                heapq.heappush(ready, k)
    return order
