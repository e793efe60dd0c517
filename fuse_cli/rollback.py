"""Bisect a pipeline for the passes that break a promise, and drop them.

fuse keeps two promises about what it writes: the outputs are the original's (verification) and
the estimated peak activation memory is not above the original's (the peak guard). Both are
judged on a whole candidate; when one breaks, the pass responsible is found by bisecting the
pipeline (a prefix of passes either keeps the promise or not), dropped, and the rest run again,
until the candidate keeps it. Passes are only ever dropped, so this ends.

A prefix is judged against the break the whole candidate shows (the judge gets that evidence),
not against every way a prefix could break: a prefix may break the promise where the whole
pipeline does not (a pass that raises the peak at one shape setting until a later pass lowers it
again), and blaming the pass that ends such a prefix drops a pass that broke nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from fuse_cli.pipeline.base import Pass

Candidate = TypeVar("Candidate")
Evidence = TypeVar("Evidence")


@dataclass(frozen=True)
class Kept(Generic[Candidate, Evidence]):
    candidate: Candidate  # the last one built: it keeps the promise, unless no pass is left to drop
    evidence: Evidence  # the judge's word on it
    active: list[Pass]
    dropped: list[tuple[Pass, Evidence]]  # each pass with the judge's word on the smallest prefix it broke


def drop_breaking_passes(passes: Sequence[Pass], candidate: Candidate, build: Callable[[list[Pass]], Candidate],
                         judge: Callable[[Candidate, Evidence | None], tuple[bool, Evidence]]
                         ) -> Kept[Candidate, Evidence]:
    """`candidate` is build(passes), already made. judge(candidate, whole) -> (promise kept,
    evidence): `whole` is None for a whole candidate, and the whole candidate's evidence when a
    prefix is judged in the bisection (judge the prefix against that break only)."""
    active = list(passes)
    kept, evidence = judge(candidate, None)
    dropped: list[tuple[Pass, Evidence]] = []
    while not kept and active:
        good, bad, bad_evidence = 0, len(active), evidence  # prefix `good` keeps it, prefix `bad` breaks it
        while bad - good > 1:
            middle = (good + bad) // 2
            middle_kept, middle_evidence = judge(build(active[:middle]), evidence)
            if middle_kept:
                good = middle
            else:
                bad, bad_evidence = middle, middle_evidence
        dropped.append((active.pop(bad - 1), bad_evidence))
        candidate = build(active)
        kept, evidence = judge(candidate, None)
    return Kept(candidate, evidence, active, dropped)
