"""The stored node order, chosen for a lower peak: no operator or value changes."""

from __future__ import annotations

import onnx

from fuse_cli.core.order import consumed_names, runtime_order_of
from fuse_cli.pipeline.base import Estimates, ModelPass
from fuse_cli.pipeline.records import OrderRecord
from fuse_cli.pipeline.registry import register
from fuse_cli.scheduling import reorder, schedule

# The whole search's budget: Serenity's program, the walk search and the judge share it. On the
# 12k-node transformer stack the pass takes about this long (benchmarks/results/schedule.md).
TIME_CAP_S = 2.0


@register
class Schedule(ModelPass):
    """Store the nodes in an order with a lower estimated peak activation memory. Of two branches
    that meet, the one run first holds its output while the other runs:

        x ─┬─ Conv(64 ch) ── Relu ── Conv(8 ch) ─┐          run the wide branch first: its
           └─ Conv(8 ch) ────────────────────────┴─ Add    64 channels are freed before the
                                                            narrow branch's 8 are made

    onnxruntime does not run the stored order: its default is a reverse depth-first walk from the
    outputs, exploring a node's producers highest stored index first, so the stored indices steer
    it (--schedule-for onnxruntime, the default for onnxruntime targets); other runtimes run the
    stored order (--schedule-for stored); --target onnx judges both, never worse for either.

    Candidates: Liu's rule (optimal on trees), Serenity's dynamic program over run sets (exact
    among chain-contiguous orders while it fits its beam), a local search over walks; each judged
    by the peak guard's own estimate at every shape setting it uses. The input order is kept
    unless a candidate is never worse anywhere and better at the bound dims by 256 KiB and 1% (what
    a measurement would confirm: scheduling/search.py's MIN_GAIN_BYTES), or when a
    lower bound (each node's inputs + outputs + scratch) shows no order could gain that much.
    The search stops after 2 s; runs last, after every fusion.
    """

    name = "schedule"
    description = "Store the nodes in an order with a lower estimated peak (no operator changes)"
    label = "Node order"

    def run(self, model: onnx.ModelProto, estimates: Estimates) -> OrderRecord:
        try:
            floor = None if estimates.floor is None else (lambda order: estimates.floor(model, order))
            result = schedule(model, estimates.sizes(model), lambda order: estimates.peaks(model, order),
                              estimates.rules, time_cap_s=TIME_CAP_S, extra_weights=estimates.extra_weights,
                              floor=floor)
        except ValueError as exc:  # a graph the order search cannot read (a tensor written twice): as it is
            return OrderRecord(self.name, self.label, tuple(estimates.rules), (), (), 0, "kept", False,
                               f"the order was kept: {exc}", 0.0)
        unscheduled: tuple[int, ...] = ()
        input_order: tuple[int, ...] = ()
        if result.changed:
            nodes = list(model.graph.node)
            position = {original: k for k, original in enumerate(result.stored)}
            unscheduled = tuple(position[i] for i in runtime_order_of(nodes, [consumed_names(n) for n in nodes]))
            input_order = tuple(position[i] for i in range(len(nodes)))
            reorder(model, result.stored)
        return OrderRecord(self.name, self.label, tuple(estimates.rules),
                           tuple(result.before[r] for r in estimates.rules),
                           tuple(result.after[r] for r in estimates.rules),
                           result.lower_bound, result.method, result.exact, result.reason, result.seconds, unscheduled,
                           input_order)
