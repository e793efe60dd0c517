"""Which stored order to write: candidates from Liu's rule, Serenity's program and a local search
over walks, each judged by the memory model itself, the input order kept unless one is better by
an amount the estimate can vouch for."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx

from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.shapes import ShapeTable
from fuse_cli.core.order import runtime_order_of
from fuse_cli.scheduling import program, walks
from fuse_cli.scheduling.dag import Dag, ranks

RULES = ("onnxruntime", "stored")
# A gain below either figure is not one a user's measurement would confirm: the estimate matches
# the allocator's exact count within ~2% (memory_truth's allocated column), but the resident figure
# (VmHWM) reads up to a few hundred KiB off below a few MiB (FACTS.md). 256 KiB rather than the
# 1 MiB of old (set when the measurement itself moved 0.7-1.1 MiB between runs): on the randomly
# wired networks a 0.77 MiB gain of 7.7 MiB was left on the table.
MIN_GAIN_BYTES = 1 << 18
MIN_GAIN_FRACTION = 0.01


def gain_needed(peak: int) -> int:
    """The least a rearrangement must lower a peak of `peak` bytes by to be taken (MIN_GAIN_*)."""
    return max(MIN_GAIN_BYTES, int(peak * MIN_GAIN_FRACTION))


# The estimate's own noise: a peak change within max(0.5% of the peak, 4 KiB) is alignment or an
# 8-byte shape tensor alive a step longer. The peak guard lets growth within it pass (strict to the
# byte, it dropped attention for 8 bytes and CSE for 32), and a change that adds nothing to the
# graph (unhold-buffers' declarations) is taken for a gain beyond it.
PEAK_TOLERANCE_FRACTION, PEAK_TOLERANCE_MIN_BYTES = 0.005, 4096


def peak_tolerance(peak: int) -> int:
    """Bytes a peak of `peak` bytes may move by as the estimate's noise (PEAK_TOLERANCE_*)."""
    return max(int(peak * PEAK_TOLERANCE_FRACTION), PEAK_TOLERANCE_MIN_BYTES)

# An execution order (indices into graph.node; None: onnxruntime's order of the nodes as stored,
# which a caller may have estimated already) -> the estimated peak at each shape setting.
Judge = Callable[[Sequence[int] | None], tuple[int, ...]]


@dataclass(frozen=True)
class Scheduled:
    """The order chosen for one model. `stored` indexes the input's nodes (the input's own order
    when kept); peaks are per rule, per shape setting, in bytes; `lower_bound` is a peak no order
    goes below at the first setting (dag.Dag.lower_bound)."""

    stored: tuple[int, ...]
    before: dict[str, tuple[int, ...]]
    after: dict[str, tuple[int, ...]]
    lower_bound: int
    method: str = "kept"   # the winning candidate: "liu", "dp", "dp-beam", "local"
    exact: bool = False    # the program finished without dropping states and won
    reason: str = ""       # why the input order was kept
    seconds: float = 0.0
    tried: tuple[str, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return self.method != "kept"


def memory_judge(model: onnx.ModelProto, settings: Sequence[tuple[ShapeTable, ShapeTable]],
                 extra_weights: Sequence[str] = ()) -> Judge:
    """The memory model's peak at each setting, given as (sizes, planner shapes) table pairs."""
    def peaks(order: Sequence[int] | None) -> tuple[int, ...]:
        return tuple(profile_memory(model, sized, extra_weights=extra_weights, symbolic_shapes=planner,
                                    order=order).peak_bytes for sized, planner in settings)
    return peaks


def execution_order(dag: Dag, stored: Sequence[int], rule: str) -> list[int] | None:
    """The order `stored` runs in under `rule`, as indices into the input's nodes (None: the
    input's own onnxruntime order)."""
    if rule == "stored":
        return list(stored)
    if list(stored) == list(range(len(dag.nodes))):
        return None
    permuted = runtime_order_of([dag.nodes[i] for i in stored], [dag.consumed[i] for i in stored])
    return [stored[k] for k in permuted]


def schedule(model: onnx.ModelProto, sizes: ShapeTable, judge: Judge, rules: Sequence[str] = ("onnxruntime",), *,
             time_cap_s: float = 2.0, extra_weights: Sequence[str] = (),
             floor: Callable[[Sequence[int] | None], int] | None = None) -> Scheduled:
    """The stored order of `model`'s nodes with the lowest estimated peak under `rules` (each of
    RULES: "onnxruntime", the order onnxruntime's walk makes of it; "stored", as stored), never
    above the input order's under any rule at any setting the judge sizes, and below it at the
    first setting by MIN_GAIN for at least one rule; else the input order. sizes: the first
    setting's shapes, for the search's own sizing. floor(order): what no order can free at the
    peak of `order` (None: onnxruntime's order of the input), read off the judge's estimate: where
    it leaves no gain worth taking, the search is not even built (linear, but 0.35 s at 12k nodes)."""
    started = time.monotonic()
    deadline = started + time_cap_s
    original = tuple(range(len(model.graph.node)))
    # The input's own order under each rule: onnxruntime's walk of it (None), or as stored.
    as_stored = {"onnxruntime": None, "stored": list(original)}
    before = {rule: judge(as_stored[rule]) for rule in rules}

    if floor is not None:
        floors = {rule: floor(as_stored[rule]) for rule in rules}
        if all(before[rule][0] - floors[rule] < gain_needed(before[rule][0]) for rule in rules):
            return _kept(Scheduled(original, before, before, max(floors.values())), started,
                         "no order can lower the peak by a gain the estimate vouches for (at the peak, "
                         f"{max(floors.values())} bytes are the node's own inputs, outputs and scratch)")
    dag = Dag(model, sizes, extra_weights)
    bound = dag.lower_bound()
    kept = Scheduled(original, before, before, bound)

    if all(before[rule][0] - bound < gain_needed(before[rule][0]) for rule in rules):
        return _kept(kept, started, "no order can lower the peak by a gain the estimate vouches for "
                                    f"(lower bound {bound} bytes)")
    candidates: dict[str, list[int]] = {"liu": walks.liu_walk(dag)}
    found = program.best_order(dag, started + 0.4 * time_cap_s)
    exact = False
    if found is not None:
        order, exact = found
        candidates["dp" if exact else "dp-beam"] = order
    stored_orders: list[tuple[str, list[int]]] = []
    if "onnxruntime" in rules:
        walked = {name: walks.walk(dag, ranks(order)) for name, order in candidates.items()}
        seed = min(walked, key=lambda name: dag.simulate(walked[name]))
        walked["local"] = walks.improve_walk(dag, ranks(walked[seed]), started + 0.7 * time_cap_s)
        stored_orders += [(name, walks.stored_for_walk(dag, post)) for name, post in walked.items()]
    if "stored" in rules:
        stored_orders += list(candidates.items())

    best: tuple[tuple, str, list[int], dict[str, tuple[int, ...]]] | None = None
    tried, timed_out = [], False
    for name, stored in stored_orders:
        if time.monotonic() > deadline:
            timed_out = True
            break
        if tuple(stored) == original:
            continue
        tried.append(name)
        peaks = {rule: judge(execution_order(dag, stored, rule)) for rule in rules}
        if any(a > b for rule in rules for a, b in zip(peaks[rule], before[rule])):
            continue  # worse somewhere: never
        if not any(before[rule][0] - peaks[rule][0] >= gain_needed(before[rule][0]) for rule in rules):
            continue
        score = (max(peaks[rule][0] / max(before[rule][0], 1) for rule in rules), sum(sum(p) for p in peaks.values()))
        if best is None or score < best[0]:
            best = (score, name, stored, peaks)
    if best is None:
        why = ("the time cap ran out before a better candidate was judged" if timed_out else
               "no candidate order lowers the estimated peak by a gain the estimate vouches for")
        return _kept(kept, started, why, tuple(tried))
    _, name, stored, peaks = best
    return Scheduled(tuple(stored), before, peaks, bound, name, exact and name == "dp", "",
                     time.monotonic() - started, tuple(tried))


def _kept(kept: Scheduled, started: float, reason: str, tried: tuple[str, ...] = ()) -> Scheduled:
    return Scheduled(kept.stored, kept.before, kept.after, kept.lower_bound, "kept", False, reason,
                     time.monotonic() - started, tried)


def reorder(model: onnx.ModelProto, stored: Sequence[int]) -> None:
    """Store `model`'s nodes in `stored` order, in place (a copy would hold every weight twice)."""
    graph = model.graph
    nodes = list(graph.node)
    del graph.node[:]  # the Python references stay valid, detached from the list
    graph.node.extend(nodes[i] for i in stored)
