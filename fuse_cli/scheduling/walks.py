"""Orders onnxruntime can be made to run: its DEFAULT order is a reverse depth-first walk from the
nodes no node reads, exploring a node's producers highest stored index first (memory.py's
`runtime_order`). Only the stored indices steer it, and only among a node's producers.

A walk is given by a rank per node (lower: explored first). onnxruntime explores the highest index
first, so the stored order that makes it run a walk is the post-order of the same walk with every
sibling order reversed (`stored_for_walk`): a topological order in which, at each node, the
producer to explore first stands last. Exact on trees and where branches share only what every
branch has already visited; where two branches share an unvisited ancestor the reversed walk may
meet it first and onnxruntime then runs a slightly different order. So the search always judges
onnxruntime's order replayed on the stored order, never the walk it meant.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fuse_cli.scheduling.dag import Dag, ranks, topological_order


def walk(dag: Dag, rank: Sequence[int]) -> list[int]:
    """Post-order of the reverse depth-first walk exploring roots and producers by ascending rank."""
    by_rank = rank.__getitem__
    visited = [False] * len(dag.nodes)
    post: list[int] = []
    for root in sorted(dag.roots(), key=by_rank):
        visited[root] = True
        stack = [(root, iter(sorted(dag.producers[root], key=by_rank)))]
        while stack:
            node, pending = stack[-1]
            for j in pending:
                if not visited[j]:
                    visited[j] = True
                    stack.append((j, iter(sorted(dag.producers[j], key=by_rank))))
                    break
            else:
                stack.pop()
                post.append(node)
    return post


def stored_for_walk(dag: Dag, post: Sequence[int]) -> list[int]:
    """A stored order onnxruntime's walk turns into the walk `post` (see the module docstring)."""
    reverse_rank = [0] * len(dag.nodes)
    for position, node in enumerate(post):
        reverse_rank[node] = -position
    return walk(dag, reverse_rank)


def liu_walk(dag: Dag) -> list[int]:
    """Liu's rule (Liu 1987, the optimal post-order of a tree; the Sethi-Ullman idea for memory):
    at each node explore the producers by decreasing (subtree peak - output bytes). Subtree peaks
    are computed bottom-up, a producer read by several nodes counted as live already (a fork's
    input is computed by whichever branch runs first and held by all). Linear time."""
    n = len(dag.nodes)
    peak = [0] * n
    for i in topological_order(dag.producers):
        own = [j for j in dag.producers[i] if len(dag.readers[j]) == 1]
        own.sort(key=lambda j: peak[j] - dag.out_bytes[j], reverse=True)
        running, best = 0, 0
        for j in own:
            best = max(best, running + peak[j])
            running += dag.out_bytes[j]
        peak[i] = max(best, running + dag.out_bytes[i] + dag.workspace[i])
    # Ties keep the stored order's preference: onnxruntime explores the higher index first.
    order = sorted(range(n), key=lambda i: (-(peak[i] - dag.out_bytes[i]), -i))
    return walk(dag, ranks(order))


def improve_walk(dag: Dag, rank: list[int], deadline: float) -> list[int]:
    """Local search over walks: at each node reading several producers, try exploring each
    producer first; keep a change when the search's peak of the walk drops. Returns the best
    walk's post-order (first improvement; stops at the deadline)."""
    rank = list(rank)
    best_order = walk(dag, rank)
    best = dag.simulate(best_order)
    joins = [i for i in range(len(dag.nodes)) if len(dag.producers[i]) > 1]
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for v in joins:
            for p in dag.producers[v]:
                if time.monotonic() > deadline:
                    return best_order
                first = min(rank[j] for j in dag.producers[v])
                if rank[p] == first:
                    continue
                trial = list(rank)
                trial[p] = first - 1
                order = walk(dag, trial)
                peak = dag.simulate(order)
                if peak < best:
                    best, best_order, rank, improved = peak, order, trial, True
    return best_order
