"""Verification's verdict as records: each output's statistics and the verdict over all of them.
Below both the code that fills them (verify.py, promises.py) and the code that renders them
(report/)."""

from __future__ import annotations

from dataclasses import dataclass

MATCH, MISMATCH, INCONCLUSIVE, UNVERIFIABLE = "match", "mismatch", "inconclusive", "unverifiable"


@dataclass(frozen=True)
class OutputComparison:
    """One output at one or more shape settings (the worst figures of all of them). Statistics
    are over the elements finite in both models; `nonfinite_mismatches` counts positions where
    NaN/inf in one model is not the same NaN/inf in the other."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_rel_diff: float
    cosine_similarity: float
    rtol: float
    atol: float
    passed: bool
    nonfinite_mismatches: int = 0
    all_nonfinite: bool = False  # nothing finite to compare in the original or the optimized output
    problem: str | None = None  # a difference no statistic measures: another shape or dtype
    # for an output downstream of a quantizer: how far onnxruntime's own optimizations move it from
    # the original as written on the same inputs (verify.compare_outputs); atol is at least this
    runtime_envelope: float | None = None
    beyond: int = 0  # elements outside the tolerance
    # an output after a quantizer beyond its bounds in a few elements at this setting (a rounding
    # flip) and within them on fresh inputs there (verify.FLIP_FRACTION): passed, and said
    flipped_at: str | None = None


@dataclass(frozen=True)
class VerifyResult:
    """The verdict, with the evidence. `status`:
    - match: every output within tolerance at every shape setting;
    - mismatch: an output differs, or the optimized model fails where the original runs (`reason`);
    - inconclusive: nothing differs, but an output is entirely NaN/inf in one model, so nothing
      was compared;
    - unverifiable: the original itself cannot load or run here (`reason`)."""

    outputs: tuple[OutputComparison, ...]
    status: str = MATCH
    reason: str | None = None
    settings: tuple[tuple[tuple[str, int], ...], ...] = ()  # the symbolic dims of each run
    settings_note: str | None = None  # where the settings came from, when not the distinct primes

    @property
    def passed(self) -> bool:
        return self.status == MATCH

    def failing(self) -> tuple[OutputComparison, ...]:
        return tuple(o for o in self.outputs if not o.passed)
