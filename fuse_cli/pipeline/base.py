"""What a pass is: a declarative pattern with a precondition and a rewrite, or (rarely) a
whole-graph transformation such as constant folding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.analysis.shapes import ShapeTable
from fuse_cli.match import Alt, Match, Op
from fuse_cli.pipeline.records import FusionRecord, OrderRecord
from fuse_cli.scheduling import peak_tolerance
from fuse_cli.targets import TARGETS

ALL_TARGETS = frozenset(TARGETS)


@dataclass(frozen=True)
class Decline:
    """Why a check does not fuse a match, in plain words: the near-miss the report shows. A check
    returns None or a Decline; helpers that compute a value return the value or a Decline."""

    reason: str

    def __str__(self) -> str:
        return self.reason

    @classmethod
    def unless(cls, reason: str | None) -> Decline | None:
        """A Decline from a reason GraphEditor or the target table gives (None: no decline)."""
        return cls(reason) if reason else None


class Pass:
    """Common declaration: a stable kebab-case name, a one-line description, the non-standard
    operators it emits (from which `register` derives the targets it belongs to, see
    fuse_cli/targets.py), and the opset its output needs."""

    name: ClassVar[str]
    description: ClassVar[str]
    emits: ClassVar[tuple[str, ...]] = ()  # "domain::op", or "op" in the default domain
    targets: ClassVar[frozenset[str]] = ALL_TARGETS
    # A pass written for what one onnxruntime provider does at load (write-cpu-casts: the CPU's
    # inserted Casts) belongs to the targets that run on that provider alone.
    for_provider: ClassVar[str | None] = None
    min_opset: ClassVar[int] = 1
    # Where onnxruntime runs the emitted operator at older opsets than the standard defines it
    # (it registers LayerNormalization below 17), its targets may fuse from this opset.
    runtime_min_opset: ClassVar[int | None] = None

    def required_opset(self, target: str) -> int:
        if target != "onnx" and self.runtime_min_opset is not None:
            return self.runtime_min_opset
        return self.min_opset

    @property
    def explanation(self) -> str:
        """The docstring: the math and a picture of the matched subgraph."""
        return (type(self).__doc__ or self.description).strip()


@dataclass(frozen=True)
class Requirement:
    """A condition a match must meet to be the pattern at all, in words (`says`) and as a test."""

    says: str
    holds: Callable[[Match, GraphEditor], bool]


class PatternPass(Pass):
    """pattern + check + rewrite. The engine matches, applies the shared safety check
    (`GraphEditor.replace_reason`), then `check`, then `rewrite`, and does the splicing and the
    memory accounting. `check` is the only place a pass declines; `rewrite` never does."""

    label: ClassVar[str]
    pattern: ClassVar[Op | Alt]
    # Capture names of matched nodes whose outputs may be read outside the match, because the
    # rewrite produces those tensors too (as an extra output of the fused node).
    keeps: ClassVar[tuple[str, ...]] = ()

    # Structural conditions the declarative pattern cannot state ("this Reshape keeps the shape"),
    # declared with the pattern: a match failing one is not this pattern, silently (a near-miss
    # comes from `check` alone); `fuse passes --explain` lists them.
    requires: ClassVar[tuple[Requirement, ...]] = ()

    def matches(self, m: Match, g: GraphEditor) -> bool:
        """The declared requirements all hold (passes declare them; they do not override this)."""
        return all(requirement.holds(m, g) for requirement in self.requires)

    def emitted_at(self, m: Match, g: GraphEditor) -> tuple[np.dtype | None, gs.Node | None]:
        """The dtype the emitted operators compute in (the engine asks targets.emit_reason at it,
        before `check`), and the node a target decline names (None: the reason alone)."""
        return g.dtype(m.root.outputs[0]), None

    def check(self, m: Match, g: GraphEditor) -> Decline | None:
        return None

    def rewrite(self, m: Match, g: GraphEditor) -> Replacement:
        raise NotImplementedError


class GraphPass(Pass):
    """A transformation over the whole graph; returns the records of what it did."""

    label: ClassVar[str]

    def run(self, g: GraphEditor) -> list[tuple[list[str], list[str], list[str]]]:
        """Returns (replaced node names, created node names, removed tensor names) per change."""
        raise NotImplementedError


@dataclass(frozen=True)
class Estimates:
    """What a model pass may ask of the memory model (the peak guard's own estimate, so that the
    guard and the pass never disagree): `peaks(model, order)`, the estimated peak of `model`'s
    nodes run in `order` (indices into graph.node) at each shape setting the guard judges;
    `sizes(model)`, its shapes at the first setting; the graph inputs that are weights; the
    execution rules the written order is for (config.schedule_rules); and `floor(model, order)`,
    what no order can free at that order's peak at the first setting (a bound read off the
    estimate already made: no search is built to learn that none can gain)."""

    peaks: Callable[[onnx.ModelProto, Sequence[int]], tuple[int, ...]]
    sizes: Callable[[onnx.ModelProto], ShapeTable]
    extra_weights: tuple[str, ...]
    rules: tuple[str, ...]
    floor: Callable[[onnx.ModelProto, Sequence[int] | None], int] | None = None
    # MemoryProfile.held_across_peak of `model` in onnxruntime's order at the first setting, then at
    # each other setting, each buffer once
    held: Callable[[onnx.ModelProto], tuple] | None = None
    # `model`'s shapes as onnxruntime's planner compares them (no dim bound)
    planner: Callable[[onnx.ModelProto], ShapeTable] | None = None

    def peaks_by_rule(self, model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
        """The estimated peaks of `model` as stored, per execution rule and setting; onnxruntime's
        always (the report's)."""
        orders = {"onnxruntime": None, "stored": list(range(len(model.graph.node)))}
        return {rule: self.peaks(model, orders[rule]) for rule in {"onnxruntime", *self.rules}}


def peak_change(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> int:
    """A model pass's part of the peak change (Estimates.peaks_by_rule before and after it): at the
    bound dims, in onnxruntime's order (the report's)."""
    return after["onnxruntime"][0] - before["onnxruntime"][0]


def never_higher(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> bool:
    """`after`'s estimated peak is at most `before`'s at every setting under every rule (the bar of
    a change made for speed that must cost no memory: pin-residual-dims)."""
    return all(a <= b for rule in before for a, b in zip(after[rule], before[rule]))


def lower_without_growth(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> bool:
    """A model pass's bar (Estimates.peaks_by_rule before and after it): never worse at any setting
    under any rule, and lower by more than the estimate's noise (scheduling.peak_tolerance) at the
    bound dims under some rule, or at a larger setting in onnxruntime's order. For a change that
    computes nothing new (declared dims, Casts onnxruntime inserts anyway) the bar is the peak
    guard's own, not a reordering's (gain_needed, 1%): a fusion the guard leaves out for growing the
    peak by 0.54% is kept where a declaration lowers it by 0.93% (Phi-3's decode step at opset 23:
    every rotary and attention fused, 55.75 -> 55.57 MB estimated at batch 64; the allocator
    measured the undeclared output's growth too, 55.81 -> 56.12 MB)."""
    never_worse = never_higher(before, after)
    goals = [(rule, 0) for rule in before] + [("onnxruntime", i) for i in range(1, len(before["onnxruntime"]))]
    return never_worse and any(before[rule][i] - after[rule][i] > peak_tolerance(before[rule][i]) for rule, i in goals)


class ModelPass(Pass):
    """A transformation of the exported model judged by the memory model, run once after the graph
    passes reached their fixpoint, on what onnxruntime will plan: the stored node order, which
    graphsurgeon's cleanup and sort would not keep, or the dims its planner sees. Changes no value;
    returns the record of what it did (an OrderRecord, or FusionRecords of the nodes it added),
    `model` changed in place."""

    label: ClassVar[str]

    def run(self, model: onnx.ModelProto, estimates: Estimates) -> OrderRecord | tuple[FusionRecord, ...]:
        raise NotImplementedError
