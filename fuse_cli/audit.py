"""The memory side of one optimize run: the estimated peak activation memory of the original and
of each candidate, the peak guard (fuse never writes a model whose estimated peak exceeds the
original's unless asked), and the memory audit in the report.

The guard judges two shape settings: the bound one (the user's --dim, unbound symbols at 1) and a
larger one (every symbol at LARGER times its bound value, at least LARGER_AT_LEAST), because which tensors are alive at the
peak changes with size: a rewrite that wins at batch 1 can lose at batch 8 (attention's head-major
copies grow with sequence, a folded weight does not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import onnx

from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import MemoryProfile, profile_memory
from fuse_cli.analysis.shapes import ShapeTable, infer_shapes
from fuse_cli.config import FuseConfig
from fuse_cli.core.domains import has_contrib_nodes
from fuse_cli.errors import UsageError
from fuse_cli.graph.io import LoadedModel
from fuse_cli.input_domain import integer_ranges
from fuse_cli.pipeline.records import FusionRecord
from fuse_cli.report.model import MeasuredPeaks, MemoryAudit, PeakGrowth

# The second setting: every symbol LARGER times its bound value, and at least LARGER_AT_LEAST
# (unbound symbols count as 1, where kernels' fixed scratch dwarfs the activations).
LARGER, LARGER_AT_LEAST = 4, 64


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
        self._settings = [self._setting(bound.bound_dims, bound, config.input_shapes)]
        # whole input shapes fix the sizes: nothing to grow. The larger setting is built on first
        # use: the audit alone (--allow-peak-growth) never needs it.
        self._larger = ({name: max(value * LARGER, LARGER_AT_LEAST) for name, value in bound.bound_dims.items()}
                        if bound.bound_dims and not config.input_shapes else None)
        self._profiles: list[tuple[onnx.ModelProto, int, MemoryProfile]] = []  # a few recent, by identity
        self._symbolic: tuple[onnx.ModelProto, ShapeTable] | None = None

    def _setting(self, dims, shapes: ShapeTable, input_shapes) -> _Setting:
        before = profile_memory(self.original, shapes, extra_weights=self.defaults, symbolic_shapes=self.symbolic)
        return _Setting(dict(dims), shapes, dict(input_shapes), before)

    @property
    def settings(self) -> list[_Setting]:
        """The bound setting, then the larger one (when the model has symbols)."""
        if self._larger is not None:
            self._settings.append(self._setting(self._larger, _infer(self.original, self._larger, {}), {}))
            self._larger = None
        return self._settings

    @property
    def before(self) -> MemoryProfile:
        return self._settings[0].before

    def profile(self, model: onnx.ModelProto, index: int = 0) -> MemoryProfile:
        for cached, i, profile in self._profiles:
            if cached is model and i == index:
                return profile
        setting = (self._settings if index == 0 else self.settings)[index]
        # onnx cannot infer contrib operators (FusedConv, ...), but a fused node writes the tensor
        # its pattern's root wrote, under the same name: the original's shapes still hold for it.
        bound = _fill_from(_infer(model, setting.dims, setting.input_shapes), setting.shapes)
        profile = profile_memory(model, bound, extra_weights=self.defaults,
                                 symbolic_shapes=_fill_from(self._planner_shapes(model), self.symbolic))
        self._profiles = [*self._profiles[-3:], (model, index, profile)]
        return profile

    def _planner_shapes(self, model: onnx.ModelProto) -> ShapeTable:
        """The shapes with no dim bound, as onnxruntime's planner compares them. onnxruntime infers
        its contrib operators' outputs (MultiHeadAttention, ...) at run time: fill what onnx cannot
        infer from its symbolic inference, only then (on a 12k-node graph it takes longer than the
        whole pipeline)."""
        if self._symbolic is None or self._symbolic[0] is not model:
            self._symbolic = (model, infer_shapes(model, symbolic=has_contrib_nodes(model)))
        return self._symbolic[1]

    def growth(self, model: onnx.ModelProto) -> tuple[PeakGrowth, ...]:
        """Where the candidate's estimated peak is above the original's (empty: never worse)."""
        grown = []
        for index, setting in enumerate(self.settings):
            after = self.profile(model, index)
            if after.peak_bytes > setting.before.peak_bytes:
                alive = tuple(t.name for t in sorted(after.live_at_peak, key=lambda t: -(t.nbytes or 0))[:3])
                grown.append(PeakGrowth(tuple(sorted(setting.dims.items())), setting.before.peak_bytes,
                                        after.peak_bytes, after.peak_node, alive))
        return tuple(grown)


def memory_audit(estimate: PeakEstimate, optimized: onnx.ModelProto, fusions: list[FusionRecord],
                 bound: ShapeTable) -> MemoryAudit:
    """Before and after at the bound shapes, and each fusion kind's part of the peak change.

    The parts add up to the total: in the order the kinds first fused, each is what taking its
    removed intermediates away too does to the original's peak; what the new operators bring
    (their outputs' buffer reuse, their kernels' scratch) is the remainder, reported as its own
    row, not spread over the kinds."""
    before, after = estimate.before, estimate.profile(optimized)
    removed: dict[tuple[str, str], set[str]] = {}
    for record in fusions:
        removed.setdefault((record.pass_name, record.pattern), set()).update(t.name for t in record.removed)
    deltas, gone, previous = [], set(), before.peak_bytes
    for (pass_name, pattern), names in removed.items():
        gone |= names
        peak = profile_memory(estimate.original, bound, extra_weights=estimate.defaults, absent=gone,
                              symbolic_shapes=estimate.symbolic).peak_bytes
        deltas.append((pass_name, pattern, peak - previous))
        previous = peak
    unknown = tuple(f"{u.tensor}[{u.dim if u.dim is not None else '?'}]" for u in bound.unknown_dims)
    return MemoryAudit(before=before, after=after, peak_delta_by_pattern=tuple(deltas),
                       peak_delta_other=after.peak_bytes - previous, unknown_dims=unknown)


def measure(source, optimized: onnx.ModelProto, bound: ShapeTable, config: FuseConfig) -> MeasuredPeaks:
    """The truth the estimate is checked against: both models run in onnxruntime, each in a
    child process, at the same bound shapes the estimate used, integers in the ranges the graph
    implies (as verification feeds them)."""
    implied = {**integer_ranges(optimized), **config.int_ranges}
    ranges = {name: span for name, span in implied.items() if span is not None}
    try:
        return MeasuredPeaks(before=measure_peak(source, dims=bound.bound_dims, int_ranges=ranges),
                             after=measure_peak(optimized, dims=bound.bound_dims, int_ranges=ranges))
    except ValueError as exc:
        raise UsageError(f"--measure: {exc}") from exc


def _infer(model: onnx.ModelProto, dims, input_shapes) -> ShapeTable:
    try:
        return infer_shapes(model, dims, input_shapes, symbolic=True)
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
