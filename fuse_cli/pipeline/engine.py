"""Runs passes to a fixpoint and keeps the books: what fused, what nearly did, and why not."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, match_root, root_op_types
from fuse_cli.pipeline.base import Decline, GraphPass, Pass, PatternPass
from fuse_cli.pipeline.records import FusionRecord, NearMiss, RemovedTensor
from fuse_cli.progress import pass_ran, update
from fuse_cli.ops.cpu_float16 import computes_in_float32_on_cpu, computing_in_float16
from fuse_cli.targets import dtype_name, emit_reason, runs_between_cpu_casts, runs_in_float32_island
from fuse_cli.toolkit.float32_islands import island

MAX_ROUNDS = 8

SizeOf = Callable[[str], "int | None"]


def run_pipeline(g: GraphEditor, passes: Sequence[Pass], size_of: SizeOf) -> tuple[list[FusionRecord], list[NearMiss]]:
    """Repeat the pipeline until a round changes nothing. The near-misses reported are those of
    that last, quiet round: they describe the final graph, not states that later rounds fixed.

    A pass is not run again on a graph nothing has changed since it last ran without a fusion:
    it would find exactly what it found then (its near-misses included), so that earlier run
    stands in for it. On a deep model this halves the sweeps of the confirming round."""
    fusions: list[FusionRecord] = []
    misses: list[list[NearMiss]] = [[] for _ in passes]
    version = 0  # bumped by every pass that changes the graph
    quiet_at: list[int | None] = [None] * len(passes)  # the version a pass last ran on and changed nothing
    for round_index in range(MAX_ROUNDS):
        changed = False
        for i, p in enumerate(passes):
            if quiet_at[i] == version:
                continue
            update(f"pass {i + 1} of {len(passes)}: {p.name}" + (f" (round {round_index + 1})" if round_index else ""))
            made, misses[i] = _run_pass(p, g, size_of)
            fusions += made
            if made:
                version += 1
                changed = True
                quiet_at[i] = None  # its own rewrites may open new matches for it
            else:
                quiet_at[i] = version
        if not changed:
            break
    return fusions, [miss for pass_misses in misses for miss in _largest_only(pass_misses)]


def _largest_only(misses: list[NearMiss]) -> list[NearMiss]:
    """One near-miss per rejected subgraph: a pass whose pattern has smaller forms (LayerNorm
    without its Add(beta)) would otherwise report the same nodes again for each form."""
    kept: list[NearMiss] = []
    kept_with: dict[str, list[set[str]]] = {}  # node name -> node sets of kept misses holding it
    for miss in sorted(misses, key=lambda m: -len(m.nodes)):
        nodes = set(miss.nodes)
        # a larger miss that covers this one holds its first node: look only at those
        if miss.nodes and any(nodes < other for other in kept_with.get(miss.nodes[0], ())):
            continue
        kept.append(miss)
        for name in nodes:
            kept_with.setdefault(name, []).append(nodes)
    order = {id(m): i for i, m in enumerate(misses)}
    return sorted(kept, key=lambda m: order[id(m)])


def _run_pass(p: Pass, g: GraphEditor, size_of: SizeOf) -> tuple[list[FusionRecord], list[NearMiss]]:
    started = time.perf_counter()
    if isinstance(p, GraphPass):
        made = [_record(p, p.label, replaced, created, removed, size_of) for replaced, created, removed in p.run(g)]
        pass_ran(p.name, time.perf_counter() - started)
        return made, []
    assert isinstance(p, PatternPass)
    made, missed, rewriting = _sweep(p, g, size_of)
    pass_ran(p.name, time.perf_counter() - started, rewriting)
    return made, missed


def _sweep(p: PatternPass, g: GraphEditor, size_of: SizeOf) -> tuple[list[FusionRecord], list[NearMiss], float]:
    """The pass's fusions and near-misses, and the seconds spent building and splicing the
    replacements (the rest of its time went to finding and checking matches)."""
    made: list[FusionRecord] = []
    missed: list[NearMiss] = []
    rewriting = 0.0
    root_ops = root_op_types(p.pattern)
    # Last node first: the largest match (rooted furthest downstream, e.g. LayerNorm's Add(beta))
    # is tried before a smaller one rooted inside it (its Div) could take part of it.
    for node in reversed(list(g.graph.nodes)):
        if node.op not in root_ops or g.is_removed(node):
            continue
        first_miss: NearMiss | None = None
        for m in match_root(p.pattern, node):
            if not p.matches(m, g):
                continue
            kept = [m.nodes[name] for name in p.keeps if name in m.nodes]
            decline = (Decline.unless(g.replace_reason(m, kept)) or _target_decline(p, m, g) or p.check(m, g)
                       or _opset_decline(p, g))
            if decline:
                first_miss = first_miss or NearMiss(p.name, p.label, tuple(n.name for n in reversed(m.covered)),
                                                    decline.reason)
                continue
            started = time.perf_counter()
            replacement = _with_float32_islands(p.rewrite(m, g), g)
            replaced = [n.name for n in reversed(m.covered)]
            removed = g.apply(m, replacement)
            rewriting += time.perf_counter() - started
            made.append(_record(p, p.label, replaced, [n.name for n in replacement.nodes], removed, size_of))
            first_miss = None
            break
        if first_miss:
            missed.append(first_miss)
    started = time.perf_counter()
    dropped = g.commit()
    rewriting += time.perf_counter() - started
    if made and dropped:
        # Nodes this sweep's rewrites left unread (a Shape chain a constant shape replaced) are
        # part of what the pass removed: count them with its last record, so no row goes negative.
        last = made[-1]
        made[-1] = dataclasses.replace(
            last, replaced=last.replaced + tuple(name for name, _ in dropped),
            removed=last.removed + tuple(RemovedTensor(t, size_of(t)) for _, outs in dropped for t in outs))
    return made, missed, rewriting


def _target_decline(p: PatternPass, m: Match, g: GraphEditor) -> Decline | None:
    """May the target run what the rewrite emits, at the dtype it computes in, and is it faster there?"""
    if not p.emits:
        return None
    dtype, subject = p.emitted_at(m, g)
    float16 = dtype is not None and dtype_name(dtype) == "float16"
    in_float32 = float16 and computes_in_float32_on_cpu(m.covered, g.opset)
    for qualified in p.emits:
        domain, _, op = qualified.rpartition("::")
        reason = emit_reason(g.target, op, dtype, domain, replaced_in_float32=in_float32)
        if reason and float16 and runs_between_cpu_casts(g.target, op, dtype, domain):
            if (kept := computing_in_float16(m.covered, g.opset)) is not None:
                reason += (f"; it would run between Casts to float32 there, where {kept.name} ({kept.op}), "
                           f"one of the nodes it replaces, runs in float16")
        if reason:
            return Decline(f"{subject.name}: {reason}" if subject is not None else reason)
    return None


def _with_float32_islands(replacement: Replacement, g: GraphEditor) -> Replacement:
    """Each float16 node the CPU provider would run as its function body, wrapped in Casts to
    float32 and back (targets.runs_in_float32_island): emitted only where the nodes it replaced ran
    in float32 there (_target_decline)."""
    nodes = [made for n in replacement.nodes for made in (island(g, n) if _needs_island(n, g) else [n])]
    return replacement if len(nodes) == len(replacement.nodes) else dataclasses.replace(replacement, nodes=nodes)


def _needs_island(node, g: GraphEditor) -> bool:
    return bool(node.outputs) and runs_in_float32_island(g.target, node.op, g.dtype(node.outputs[0]), node.domain)


def _opset_decline(p: Pass, g: GraphEditor) -> Decline | None:
    needed = p.required_opset(g.target)
    if g.opset >= needed:
        return None
    return Decline(f"the fused operator needs opset {needed}, the model has opset {g.opset}: "
                   f"pass --upgrade-opset {needed} to convert the model first")


def _record(p: Pass, label: str, replaced, created, removed, size_of: SizeOf) -> FusionRecord:
    return FusionRecord(
        pass_name=p.name,
        pattern=label,
        replaced=tuple(replaced),
        created=tuple(created),
        removed=tuple(RemovedTensor(name, size_of(name)) for name in removed),
    )
