"""The one report data model. Renderers (rich, JSON, Markdown) read it; nothing here formats text."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from fuse_cli.analysis.measure import Measurement
from fuse_cli.analysis.memory import MemoryProfile
from fuse_cli.errors import EXIT_CHECK_FAILED, EXIT_OK
from fuse_cli.pipeline.records import FusionRecord, NearMiss, OrderRecord
from fuse_cli.progress import Timings
from fuse_cli.report.verification import MISMATCH, VerifyResult

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class FusionRow:
    """One row of the savings table: every fusion of one pattern, added up."""

    pass_name: str
    pattern: str
    count: int
    nodes_removed: int
    intermediates_removed: int
    removed_bytes: int
    unknown_sizes: int
    peak_delta_bytes: int | None = None


@dataclass(frozen=True)
class MemoryAudit:
    """Liveness before and after fusion at the bound shapes, and each fusion kind's part of the
    peak change: taken in order, what its removed intermediates vanishing too does to the
    original's peak. `peak_delta_other` is the rest (tensors that became weights, the new
    operators' buffers and scratch), so the parts add up to after - before."""

    before: MemoryProfile
    after: MemoryProfile
    peak_delta_by_pattern: tuple[tuple[str, str, int], ...]  # (pass, pattern, delta bytes)
    unknown_dims: tuple[str, ...]  # "tensor[dim]" entries whose size stays unknown
    peak_delta_other: int = 0
    # The optimized model run in the order it had before the `schedule` pass (None: order kept);
    # the node order's part of the peak change is after - unscheduled.
    unscheduled: MemoryProfile | None = None

    @property
    def peak_delta_order(self) -> int:
        return 0 if self.unscheduled is None else self.after.peak_bytes - self.unscheduled.peak_bytes


@dataclass(frozen=True)
class PeakGrowth:
    """A candidate's estimated peak above the original's at one shape setting."""

    dims: tuple[tuple[str, int], ...]
    before_bytes: int
    after_bytes: int
    peak_node: str
    alive: tuple[str, ...]  # the largest tensors alive at the candidate's peak
    tolerance_bytes: int = 0  # the growth the guard let pass at this setting


@dataclass(frozen=True)
class PeakDecline:
    """A pass the peak guard left out: with it the estimated peak exceeded the original's."""

    pass_name: str
    pattern: str
    growth: tuple[PeakGrowth, ...]


@dataclass(frozen=True)
class RolledBack:
    """A pass whose rewrites changed the outputs beyond tolerance, or made the model fail where
    the original runs (`reason`; then no output was compared), and were left out."""

    pass_name: str
    output: str | None
    max_abs_diff: float | None
    reason: str | None = None

    def describe(self) -> str:
        return f"pass {self.pass_name} {self.what()}"

    def what(self) -> str:
        """What the pass did, without its name: passes rolled back for the same thing share a line."""
        if self.output is None:
            return f"broke the model ({self.reason})"
        if self.reason:
            return f"changed output {self.output!r}: {self.reason}"
        return f"changed output {self.output!r} by up to {self.max_abs_diff:.3g}"


def describe_rolled_back(rolled_back: tuple[RolledBack, ...]) -> list[str]:
    """One line per distinct thing the passes did, naming the passes: a model that onnxruntime
    cannot load after any rewrite rolls back every pass for one reason, which is one line."""
    groups: dict[str, list[str]] = {}
    for r in rolled_back:
        groups.setdefault(r.what(), []).append(r.pass_name)
    return [f"{_passes(names)} {what}; {'its' if len(names) == 1 else 'their'} rewrites were rolled back"
            for what, names in groups.items()]


def _passes(names: list[str], shown: int = 4) -> str:
    if len(names) == 1:
        return f"pass {names[0]}"
    if len(names) <= shown + 1:
        return f"passes {', '.join(names[:-1])} and {names[-1]}"
    return f"{len(names)} passes ({', '.join(names[:shown])} and {len(names) - shown} more)"


@dataclass(frozen=True)
class MeasuredPeaks:
    """Peak activation memory measured in onnxruntime, original and fused, at the bound shapes;
    `unscheduled`: the fused model in its order before the `schedule` pass (None: order kept)."""

    before: Measurement
    after: Measurement
    unscheduled: Measurement | None = None


@dataclass(frozen=True)
class Gates:
    """CI conditions that turn a successful run into a failed check (exit 1)."""

    fail_on_fusable: bool = False
    max_peak_bytes: int | None = None
    fail_on_near_miss: tuple[str, ...] = ()
    require_verified: bool = False  # anything but "outputs match" (unverifiable, inconclusive, --no-verify)


@dataclass(frozen=True)
class Report:
    model_path: str
    output_path: str | None
    target: str
    passes: tuple[str, ...]
    fusions: tuple[FusionRecord, ...]
    near_misses: tuple[NearMiss, ...]
    nodes_before: int
    nodes_after: int
    weight_bytes_before: int
    weight_bytes_after: int
    unbound_dims: tuple[str, ...] = ()
    dims: tuple[tuple[str, int], ...] = ()
    written_files: tuple[str, ...] = ()
    dry_run: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    memory: MemoryAudit | None = None
    verification: VerifyResult | None = None
    rolled_back: tuple[RolledBack, ...] = ()
    allow_mismatch: bool = False
    runtime_target_would_add: tuple[tuple[str, int], ...] = ()  # (pattern, count) with --target ort
    gates: Gates = field(default_factory=lambda: Gates())
    measured: MeasuredPeaks | None = None
    peak_guard: tuple[PeakDecline, ...] = ()  # passes left out because they raised the estimated peak
    peak_settings: tuple[tuple[tuple[str, int], ...], ...] = ()  # the dims the guard judged (empty: it was off)
    peak_tolerances: tuple[int, ...] = ()  # bytes the estimated peak may grow by at each of peak_settings
    orders: tuple[OrderRecord, ...] = ()  # what the `schedule` pass did (empty: it did not run)
    timings: Timings | None = None  # where the run's time went (api.optimize always records them)
    # The dims --dim and --input-shape bind: the graph inputs' (None: not known, all count as such).
    # Other unbound dims (onnx's unk__N inside the graph) are taken as 1 too, but no option sets them.
    input_dims: tuple[str, ...] | None = None

    def rows(self) -> list[FusionRow]:
        """Fusions grouped by (pass, pattern) in the order they first happened."""
        groups: OrderedDict[tuple[str, str], list[FusionRecord]] = OrderedDict()
        for record in self.fusions:
            groups.setdefault((record.pass_name, record.pattern), []).append(record)
        deltas = {(p, pat): d for p, pat, d in self.memory.peak_delta_by_pattern} if self.memory else {}
        rows = []
        for (pass_name, pattern), records in groups.items():
            removed = [t for r in records for t in r.removed]
            rows.append(FusionRow(
                pass_name=pass_name,
                pattern=pattern,
                count=len(records),
                nodes_removed=sum(r.nodes_removed for r in records),
                intermediates_removed=len(removed),
                removed_bytes=sum(t.nbytes or 0 for t in removed),
                unknown_sizes=sum(1 for t in removed if t.nbytes is None),
                peak_delta_bytes=deltas.get((pass_name, pattern)),
            ))
        return rows

    @property
    def removed_bytes(self) -> int:
        return sum(row.removed_bytes for row in self.rows())

    @property
    def exit_code(self) -> int:
        return EXIT_OK if not self.failures else EXIT_CHECK_FAILED

    @property
    def failures(self) -> tuple[str, ...]:
        """What makes the run a failed check (exit 1). Rolled-back passes count unless the user
        allowed mismatches: the written model is then correct but not what was asked for."""
        problems = []
        if not self.allow_mismatch:
            problems += describe_rolled_back(self.rolled_back)
        result = self.verification
        if result is not None and result.status == MISMATCH:
            problems += [f"output {o.name!r} differs from the original (max abs diff {o.max_abs_diff:.3g})"
                         for o in result.failing()] or [f"{result.reason}"]
        return tuple(problems + self._gate_failures())

    def _peak_gate_failures(self, budget: int) -> list[str]:
        """Fail closed. `fuse report` judges the model as it is (a CI step checking a committed
        model), `fuse optimize` the model it wrote; a tensor of unknown size may be the largest,
        so the gate cannot pass while one is left out of the estimate."""
        if self.memory is None:
            return ["--max-peak: the peak activation memory could not be estimated"]
        side, which = (self.memory.before, "the model's") if self.dry_run else (self.memory.after, "the output's")
        if side.unknown_tensors:
            return [f"--max-peak: {len(side.unknown_tensors)} tensors of {which} are of unknown size "
                    f"(first: {side.unknown_tensors[0]}); give their dims with --dim or --input-shape"]
        if side.peak_bytes > budget:
            return [f"--max-peak: {which} estimated peak activation memory {side.peak_bytes / 2**20:.1f} MB exceeds "
                    f"the budget of {budget / 2**20:.1f} MB"]
        return []

    def _gate_failures(self) -> list[str]:
        gates, problems = self.gates, []
        fusable = [r for r in self.rows() if r.pass_name != "fold-constants" or r.intermediates_removed]
        if gates.fail_on_fusable and fusable:
            kinds = ", ".join(f"{r.count} x {r.pattern}" for r in fusable)
            problems.append(f"--fail-on-fusable: the model still has fusable patterns ({kinds})")
        if gates.max_peak_bytes is not None:
            problems += self._peak_gate_failures(gates.max_peak_bytes)
        if gates.require_verified and (self.verification is None or not self.verification.passed):
            why = "verification was off" if self.verification is None else \
                f"verification was {self.verification.status}: {self.verification.reason}"
            what = "the rewrites were not confirmed" if self.dry_run else "the output was written but not confirmed"
            problems.append(f"--require-verified: {what} ({why})")
        for name in gates.fail_on_near_miss:
            misses = [m for m in self.near_misses if m.pass_name == name]
            if misses:
                problems.append(f"--fail-on-near-miss {name}: {len(misses)} near-miss(es), first: {misses[0].reason}")
        return problems
