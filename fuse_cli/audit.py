"""The memory side of one optimize run: the estimated peak activation memory of the original and
of each candidate, the peak guard (fuse never writes a model whose estimated peak exceeds the
original's by more than max(0.5%, 4 KiB) unless asked), and the memory audit in the report.

The guard judges two shape settings: the bound one (the user's --dim, unbound symbols at 1) and a
larger one (every symbol at LARGER times its bound value, at least LARGER_AT_LEAST), because which
tensors are alive at the peak changes with size: a rewrite that wins at batch 1 can lose at batch 8
(attention's head-major copies grow with sequence, a folded weight does not).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

import onnx

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import HeldBuffer, MemoryProfile, profile_memory, profile_memory_at
from fuse_cli.analysis.shapes import ShapeTable, at_dims, infer_shapes
from fuse_cli.config import FuseConfig
from fuse_cli.core.domains import has_contrib_nodes
from fuse_cli.errors import UsageError
from fuse_cli.graph.io import LoadedModel
from fuse_cli.input_domain import integer_ranges, is_arithmetic, with_declared_arithmetic
from fuse_cli.pipeline.base import Estimates
from fuse_cli.pipeline.records import FusionRecord, OrderRecord
from fuse_cli.report.model import MeasuredPeaks, MemoryAudit, PeakGrowth
# The guard's tolerance at each setting is the estimate's noise (scheduling.peak_tolerance)
from fuse_cli.scheduling import PEAK_TOLERANCE_FRACTION, PEAK_TOLERANCE_MIN_BYTES, peak_tolerance  # noqa: F401

# The second setting: every symbol LARGER times its bound value, and at least LARGER_AT_LEAST
# (unbound symbols count as 1, where kernels' fixed scratch dwarfs the activations).
LARGER, LARGER_AT_LEAST = 4, 64


def provider_of(target: str) -> str:
    """The provider whose executor the estimate replays for `target`: CUDA for ort-cuda, else
    the CPU one (which runs --target onnx, ort-cpu, and verifies every target)."""
    return "cuda" if target == "ort-cuda" else "cpu"


@dataclasses.dataclass(frozen=True)
class _Setting:
    dims: Mapping[str, int]
    shapes: ShapeTable  # the original's, at these dims
    input_shapes: Mapping[str, tuple[int, ...]]
    before: MemoryProfile  # the original's


class PeakEstimate:
    """The original's estimated peak at each setting, computed once, and any candidate's."""

    def __init__(self, loaded: LoadedModel, bound: ShapeTable, symbolic: ShapeTable, config: FuseConfig):
        self.original, self.symbolic = loaded.model, symbolic
        self.defaults = tuple(loaded.input_defaults)
        # The provider whose executor the walk replays: the CPU one casts float16 nodes it has no
        # float16 kernel for (analysis/inserted_casts.py); an ort-cuda output runs on CUDA.
        self.provider = provider_of(config.target)
        self._settings = [self._setting(bound.bound_dims, bound, config.input_shapes)]
        # whole input shapes fix the sizes: nothing to grow. The larger setting is built on first
        # use: the audit alone (--allow-peak-growth) never needs it.
        # Dims written as arithmetic of others (`past_sequence + sequence`) are computed from the
        # grown ones, not grown on their own: past 64 and sequence 64 make 128 positions, not 64.
        self._larger = (with_declared_arithmetic(self.original, {name: max(value * LARGER, LARGER_AT_LEAST)
                                                                 for name, value in bound.bound_dims.items()
                                                                 if not is_arithmetic(name)})
                        if bound.bound_dims and not config.input_shapes else None)
        # A few recent, by identity, stored order (the `schedule` pass reorders a candidate in place)
        # and execution order (None: onnxruntime's).
        self._profiles: list[tuple[onnx.ModelProto, int, bytes, tuple[int, ...] | None, MemoryProfile]] = []
        self._table_cache: list[tuple[onnx.ModelProto, int, frozenset[bytes], ShapeTable]] = []
        self._symbolic: list[tuple[onnx.ModelProto, tuple[frozenset[bytes], bytes], ShapeTable]] = []

    def _setting(self, dims, shapes: ShapeTable, input_shapes) -> _Setting:
        before = profile_memory(self.original, shapes, extra_weights=self.defaults, symbolic_shapes=self.symbolic,
                                provider=self.provider)
        return _Setting(dict(dims), shapes, dict(input_shapes), before)

    @property
    def settings(self) -> list[_Setting]:
        """The bound setting, then the larger one (when the model has symbols)."""
        if self._larger is not None:
            # the original's unbound table at the larger dims where it names every dim. Never the
            # proofs table: it names a dim by its sizes at two prime settings, which a Max(N, 3)
            # or a round-up to a multiple of 8 only matches there, not at 1 or 64
            shapes = at_dims(self.symbolic, self._larger) or _infer(self.original, self._larger, {})
            self._settings.append(self._setting(self._larger, shapes, {}))
            self._larger = None
        return self._settings

    @property
    def before(self) -> MemoryProfile:
        return self._settings[0].before

    def profile(self, model: onnx.ModelProto, index: int = 0, order: Sequence[int] | None = None) -> MemoryProfile:
        """The candidate's profile at setting `index`; `order`: its nodes run in that order
        (indices into graph.node) rather than onnxruntime's."""
        return self.profiles(model, order, (index,))[0]

    def profiles(self, model: onnx.ModelProto, order: Sequence[int] | None = None,
                 indices: Sequence[int] | None = None) -> tuple[MemoryProfile, ...]:
        """The candidate's profiles at the settings `indices` (None: every one), from one walk."""
        indices = range(len(self.settings)) if indices is None else indices
        stored, nodes, declared = _structure(model)
        run = None if order is None else tuple(order)
        found = {i: profile for cached, i, cached_stored, cached_run, profile in self._profiles
                 if cached is model and i in indices and cached_stored == stored and cached_run == run}
        missing = [i for i in indices if i not in found]
        if missing:
            tables = [self._tables(model, i, (stored, nodes, declared)) for i in missing]
            # one planner table per candidate, whatever the setting (see _planner_shapes)
            computed = profile_memory_at(model, [bound for bound, _ in tables], extra_weights=self.defaults,
                                         provider=self.provider,
                                         symbolic_shapes=tables[0][1], order=order)
            for i, profile in zip(missing, computed):
                found[i] = profile
                # the candidate at each setting, in onnxruntime's order and in the order a scheduler judges
                self._profiles = [*self._profiles[-5:], (model, i, stored, run, profile)]
        return tuple(found[i] for i in indices)

    def _tables(self, model: onnx.ModelProto, index: int,
                structure: tuple[bytes, frozenset[bytes], bytes] | None = None) -> tuple[ShapeTable, ShapeTable]:
        """The candidate's sizes at setting `index` and its planner shapes. The sizes do not depend
        on the node order (a reordered model, same nodes, same identity, keeps them) nor on the
        declared shapes: unhold-buffers names afresh only the dims the planner has no value for, and
        at a setting every dim that inference can size has its value (onnx's inference lets an
        inferred value stand over a declared name). So a declaration tried costs one inference, the
        planner's, not one per setting besides. structure: _structure(model), when the caller has it."""
        _, nodes, declared = _structure(model) if structure is None else structure
        planner = self._planner_shapes(model, nodes, declared)
        for cached, i, fingerprint, bound in self._table_cache:
            if cached is model and i == index and fingerprint == nodes:
                break
        else:
            setting = (self._settings if index == 0 else self.settings)[index]
            # without an inference where the candidate's own unbound shapes allow (one inference of
            # a 12k-node graph: 0.2 s): the original's sizes of the names it kept, else its
            # unbound table at the setting's dims, else an inference at them
            at_setting = (_kept_from(planner, self.symbolic, setting.shapes)
                          or (None if setting.input_shapes else at_dims(planner, setting.dims)))
            # onnx cannot infer contrib operators (FusedConv, ...), but a fused node writes the tensor
            # its pattern's root wrote, under the same name: the original's shapes still hold for it.
            bound = _fill_from(at_setting or _infer(model, setting.dims, setting.input_shapes), setting.shapes)
            self._table_cache = [*self._table_cache[-3:], (model, index, nodes, bound)]
        return bound, planner

    def estimates(self, rules: tuple[str, ...]) -> Estimates:
        """What the model passes judge orders with: this estimate at every setting the guard uses
        (the larger one even with --allow-peak-growth: an order is never worse at either)."""
        return Estimates(
            peaks=lambda model, order: tuple(profile.peak_bytes for profile in self.profiles(model, order)),
            sizes=lambda model: self._tables(model, 0)[0], extra_weights=self.defaults, rules=rules,
            floor=lambda model, order: self.profile(model, 0, order).unavoidable_at_peak,
            held=self._held,
            planner=lambda model: self._tables(model, 0)[1])

    def _held(self, model: onnx.ModelProto) -> tuple[HeldBuffer, ...]:
        """Buffers held across the candidate's peak at the bound dims, then at each larger setting
        (a prefill's MLP buffers held through the next layer's attention at batch 64, not at the
        bound batch 1), each buffer once (by its first later tenant)."""
        seen: dict[str, HeldBuffer] = {}
        for profile in self.profiles(model):  # one walk for every setting
            for buffer in profile.held_across_peak:
                seen.setdefault(buffer.name, buffer)
        return tuple(seen.values())

    def _planner_shapes(self, model: onnx.ModelProto, nodes: frozenset[bytes], declared: bytes) -> ShapeTable:
        """The shapes with no dim bound, as onnxruntime's planner compares them. onnxruntime infers
        its contrib operators' outputs (MultiHeadAttention, ...) at run time: fill what onnx cannot
        infer from its symbolic inference, only then (on a 12k-node graph it takes longer than the
        whole pipeline)."""
        for cached, key, filled in self._symbolic:
            if cached is model and key == (nodes, declared):
                return filled
        # One table object per candidate, at every setting: the memory model's per-model setup
        # is cached by the table's identity (a second object would cost a second setup).
        filled = _fill_from(infer_shapes(model, symbolic=has_contrib_nodes(model)), self.symbolic)
        # two kept: a declaration tried and taken back returns to the one before
        self._symbolic = [*self._symbolic[-1:], (model, (nodes, declared), filled)]
        return filled

    def tolerances(self) -> tuple[int, ...]:
        """Per setting, the bytes a candidate's estimated peak may grow by (peak_tolerance)."""
        return tuple(peak_tolerance(setting.before.peak_bytes) for setting in self.settings)

    def growth(self, model: onnx.ModelProto, at: Sequence[tuple[tuple[str, int], ...]] | None = None
               ) -> tuple[PeakGrowth, ...]:
        """Where the candidate's estimated peak is above the original's by more than the tolerance
        (empty: never worse beyond it); `at`: only at the settings of these dims (PeakGrowth.dims)."""
        chosen = [i for i, s in enumerate(self.settings) if at is None or tuple(sorted(s.dims.items())) in at]
        grown = []
        tolerances = self.tolerances()
        for i, after in zip(chosen, self.profiles(model, indices=chosen)):
            setting, tolerance = self.settings[i], tolerances[i]
            if after.peak_bytes > setting.before.peak_bytes + tolerance:
                alive = tuple(t.name for t in sorted(after.live_at_peak, key=lambda t: -(t.nbytes or 0))[:3])
                grown.append(PeakGrowth(tuple(sorted(setting.dims.items())), setting.before.peak_bytes,
                                        after.peak_bytes, after.peak_node, alive, tolerance))
        return tuple(grown)


def memory_audit(estimate: PeakEstimate, optimized: onnx.ModelProto, fusions: list[FusionRecord],
                 bound: ShapeTable, orders: Sequence[OrderRecord] = ()) -> MemoryAudit:
    """Before and after at the bound shapes, and each fusion kind's part of the peak change.

    The parts add up to the total: in the order the kinds first fused, each is what taking its
    removed intermediates away too does to the original's peak; what the new operators bring
    (their outputs' buffer reuse, their kernels' scratch) is the remainder, reported as its own
    row, not spread over the kinds, less what a model pass estimated as its own part (views that
    keep the planner from holding a buffer: FusionRecord.peak_delta); the node order's part (the
    `schedule` pass) is the last: the optimized model run in its input order, then in the order
    written."""
    before, after = estimate.before, estimate.profile(optimized)
    reordered = next((record for record in orders if record.changed), None)
    unscheduled = estimate.profile(optimized, 0, reordered.unscheduled) if reordered is not None else None
    fused_peak = (unscheduled or after).peak_bytes
    removed: dict[tuple[str, str], set[str]] = {}
    estimated: dict[tuple[str, str], int] = {}  # the model passes' own parts (FusionRecord.peak_delta)
    for record in fusions:
        key = (record.pass_name, record.pattern)
        if record.peak_delta is not None:
            estimated[key] = estimated.get(key, 0) + record.peak_delta
        else:
            removed.setdefault(key, set()).update(t.name for t in record.removed)
    deltas, gone, previous = [], set(), before.peak_bytes
    for (pass_name, pattern), names in removed.items():
        if names <= gone:  # nothing this kind removed is still there: the same absent set, the same peak
            deltas.append((pass_name, pattern, 0))
            continue
        gone |= names
        peak = profile_memory(estimate.original, bound, extra_weights=estimate.defaults, absent=gone,
                              symbolic_shapes=estimate.symbolic, provider=estimate.provider).peak_bytes
        deltas.append((pass_name, pattern, peak - previous))
        previous = peak
    deltas += [(pass_name, pattern, delta) for (pass_name, pattern), delta in estimated.items()]
    unknown = tuple(f"{u.tensor}[{u.dim if u.dim is not None else '?'}]" for u in bound.unknown_dims)
    return MemoryAudit(before=before, after=after, peak_delta_by_pattern=tuple(deltas),
                       peak_delta_other=fused_peak - previous - sum(estimated.values()), unknown_dims=unknown,
                       unscheduled=unscheduled)


def measure(source, optimized: onnx.ModelProto, bound: ShapeTable, config: FuseConfig,
            orders: Sequence[OrderRecord] = ()) -> MeasuredPeaks:
    """The truth the estimate is checked against: both models run in onnxruntime, each in a
    child process, at the same bound shapes the estimate used, integers in the ranges the graph
    implies (as verification feeds them); and, where the `schedule` pass reordered the nodes,
    the optimized model in its input order too, which confirms (or not) the order's part."""
    implied = {**integer_ranges(optimized), **config.int_ranges}
    ranges = {name: span for name, span in implied.items() if span is not None}
    reordered = next((record for record in orders if record.changed), None)
    try:
        unscheduled = None
        if reordered is not None:
            unscheduled = measure_peak(_stored_in(optimized, reordered.input_order), dims=bound.bound_dims,
                                       int_ranges=ranges)
        return MeasuredPeaks(before=measure_peak(source, dims=bound.bound_dims, int_ranges=ranges),
                             after=measure_peak(optimized, dims=bound.bound_dims, int_ranges=ranges),
                             unscheduled=unscheduled)
    except ValueError as exc:
        raise UsageError(f"--measure: {exc}") from exc


def _stored_in(model: onnx.ModelProto, order: Sequence[int]) -> onnx.ModelProto:
    """A copy of `model` with its nodes stored in `order` (for a measurement: it holds the
    weights twice while it lives)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.node[:]
    copy.graph.node.extend(model.graph.node[i] for i in order)
    return copy


def _structure(model: onnx.ModelProto) -> tuple[bytes, frozenset[bytes], bytes]:
    """What the caches of a candidate compare to notice an edit in place, cheaply: a digest of the
    nodes and declared shapes in stored order (a reordering in place changes it), the set of
    nodes, which the sizes depend on (a reordering keeps it; a rewrite does not), and a digest of
    the declared shapes (value_info), which onnxruntime's planner reads: it keeps a declared dim's
    name (unhold-buffers). Each node serialized: 0.3 us, where reading its fields builds a wrapper
    per field, and bytes are not containers the garbage collector walks (a list per node set off
    full collections of a big process's heap: 0.3 s in all at 12k nodes)."""
    serialized = [node.SerializeToString() for node in model.graph.node]
    declared = hashlib.blake2b(b"".join(vi.SerializeToString() for vi in model.graph.value_info),
                               digest_size=16).digest()
    return (hashlib.blake2b(b"".join(serialized) + declared, digest_size=16).digest(), frozenset(serialized),
            declared)


def _kept_from(candidate: ShapeTable, original: ShapeTable, original_at: ShapeTable) -> ShapeTable | None:
    """The candidate's sizes at a setting without inferring them: a rewrite keeps what each name
    it keeps holds, so a tensor whose unbound shape (`candidate`, the planner's table) is the one
    the original's unbound inference gave under that name (`original`) has the original's size at
    the setting (`original_at`), and one whose unbound shape is all numbers has that size
    everywhere (a folded weight). None where any tensor is neither: a shape the rewrite changed
    under a kept name, or a new tensor whose size depends on the dims (then inference decides)."""
    tensors = {}
    for name, info in candidate.tensors.items():
        if info.elem_type and info.shape is not None and all(isinstance(d, int) for d in info.shape):
            tensors[name] = info
        elif original.get(name) == info and (at := original_at.get(name)) is not None:
            tensors[name] = at
        else:
            return None
    return ShapeTable(tensors=tensors, unknown_dims=tuple(u for u in original_at.unknown_dims if u.tensor in tensors),
                      bound_dims=original_at.bound_dims)


def _infer(model: onnx.ModelProto, dims, input_shapes) -> ShapeTable:
    try:
        return infer_shapes(model, dims, input_shapes, symbolic=True, outputs_declared=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _unknowns(info) -> int:
    """How much of a tensor's type is unknown: its dtype, its rank, or single dims."""
    if info.elem_type == 0 or info.shape is None:
        return 1_000
    return sum(1 for d in info.shape if d is None)


def _fill_from(table: ShapeTable, fallback: ShapeTable) -> ShapeTable:
    """`table` with the tensors it could not size taken from `fallback` (same names)."""
    missing = {name for name, info in table.tensors.items() if _unknowns(info) > 0}
    if not missing:
        return table
    merged = dict(table.tensors)
    for name in missing:
        info = fallback.get(name)
        if info is not None and _unknowns(info) < _unknowns(merged[name]):
            merged[name] = info
    filled = {name for name in missing if name in fallback.tensors}
    return dataclasses.replace(table, tensors=merged,
                               unknown_dims=tuple(u for u in table.unknown_dims if u.tensor not in filled))
