"""Serenity's dynamic program (Ahn et al., MLSys 2020) over the sets of nodes already run.

Any topological order is a path through the lattice of run sets; two partial orders that ran the
same set hold the same live buffers next, so only the lower peak of the two need be kept (then the
lower live bytes). Steps are maximal chains of single-reader, single-producer nodes run back to
back, which makes the program exact among orders that keep such chains contiguous, under the
search's sizing (dag.py), as long as no layer holds more than `beam` states; past that it keeps the
`beam` lowest and is a heuristic (a beam search), reported as inexact. Anytime: when the pace
would overrun the deadline the beam narrows, down to one state (a greedy order).
"""

from __future__ import annotations

import heapq
import time

from fuse_cli.scheduling.dag import Dag, topological_order

BEAM_WIDTH = 256
MAX_STEPS = 4000


def best_order(dag: Dag, deadline: float, beam: int = BEAM_WIDTH) -> tuple[list[int], bool] | None:
    """(order, exact) or None when the graph has more than MAX_STEPS steps or time ran out."""
    steps = _chains(dag)
    if len(steps) > MAX_STEPS:
        return None
    step_of = {}
    for s, members in enumerate(steps):
        for i in members:
            step_of[i] = s
    # Steps computing from weights alone (ConstantOfShape, shape arithmetic: hundreds in some
    # exports) are no choice worth a state: each runs just before its first reader.
    glued = [False] * len(steps)
    step_preds: list[set[int]] = [set() for _ in steps]
    for s, members in enumerate(steps):
        step_preds[s] = {step_of[j] for i in members for j in dag.producers[i] if step_of[j] != s}
        reads_input = any(b in dag.graph_inputs for b in dag.reads[members[0]])
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
    reader_mask = {b: sum(1 << step_of[i] for i in readers) for b, readers in dag.buffer_readers.items()}
    runnable = [s for s in range(len(steps)) if not glued[s]]
    start = frozenset(s for s in runnable if preds[s] == 0)
    # run set (a bit mask of steps) -> (peak, live, ready steps, order so far as a linked list)
    layer: dict[int, tuple[int, int, frozenset[int], tuple | None]] = {0: (0, dag.input_bytes, start, None)}
    exact, width, started = True, beam, time.monotonic()
    for done_steps in range(len(runnable)):
        now = time.monotonic()
        if now > deadline:
            return None
        if done_steps and width > 1:
            pace = (now - started) / done_steps
            if now + pace * (len(runnable) - done_steps) > deadline:
                width = max(1, width // 4)
        following: dict[int, tuple[int, int, frozenset[int], tuple | None]] = {}
        for mask, (peak, live, ready, trail) in layer.items():
            for s in ready:
                run = [t for t in feeders[s] if not mask >> t & 1] + [s]
                new = mask
                for t in run:
                    new |= 1 << t
                step_peak, new_live = _run(dag, [i for t in run for i in steps[t]], live, new, reader_mask)
                p = max(peak, step_peak)
                old = following.get(new)
                if old is None or (p, new_live) < old[:2]:
                    more = {t for t in succ[s] if preds[t] & ~new == 0}
                    path = trail
                    for t in run:
                        path = (t, path)
                    following[new] = (p, new_live, (ready - {s}) | more, path)
        if len(following) > width:
            exact = False
            following = dict(heapq.nsmallest(width, following.items(), key=lambda kv: kv[1][:2]))
        layer = following
    (_, (_, _, _, trail)), = layer.items()
    order_steps = []
    while trail is not None:
        order_steps.append(trail[0])
        trail = trail[1]
    order_steps.reverse()
    placed = set(order_steps)
    order_steps += [s for s in range(len(steps)) if s not in placed]  # weight-only steps nobody runnable reads
    return [i for s in order_steps for i in steps[s]], exact


def _run(dag: Dag, members: list[int], live: int, done: int, reader_mask: dict[str, int]) -> tuple[int, int]:
    """Peak and live bytes after running `members` from `live` bytes, `done` the run set after."""
    peak = 0
    for i in members:
        alloc = dag.out_bytes[i]
        freed = 0
        for b in dag.reads[i]:
            if b in dag.held or b in dag.graph_inputs or reader_mask.get(b, 0) & ~done:
                continue
            freed += dag.size.get(b, 0)
        source = dag.in_place[i]
        if (source and alloc and source not in dag.held and source not in dag.graph_inputs
                and not reader_mask.get(source, 0) & ~done and dag.size.get(source, 0) == alloc):
            alloc, freed = 0, freed - alloc  # the output takes its input's bytes
        peak = max(peak, live + alloc + dag.workspace[i])
        live += alloc - freed
    return peak, live


def _chains(dag: Dag) -> list[list[int]]:
    """Maximal chains where each node has one producer, read only by the next node."""
    head = [True] * len(dag.nodes)
    for i in range(len(dag.nodes)):
        if len(dag.producers[i]) == 1 and len(dag.readers[dag.producers[i][0]]) == 1:
            head[i] = False
    steps = []
    for i in topological_order(dag.producers):
        if head[i]:
            chain = [i]
            while len(dag.readers[chain[-1]]) == 1 and not head[dag.readers[chain[-1]][0]]:
                chain.append(dag.readers[chain[-1]][0])
            steps.append(chain)
    return steps
