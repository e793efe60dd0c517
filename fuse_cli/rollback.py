"""Bisect a pipeline for the passes that break a promise, and drop them.

fuse keeps two promises about what it writes: the outputs are the original's (verification) and
the estimated peak activation memory is not above the original's (the peak guard). Both are
judged on a whole candidate; when one breaks, the pass responsible is found by bisecting the
pipeline (a prefix of passes either keeps the promise or not), dropped, and the rest run again,
until the candidate keeps it. Passes are only ever dropped, so this ends.
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
                         judge: Callable[[Candidate], tuple[bool, Evidence]]) -> Kept[Candidate, Evidence]:
    """`candidate` is build(passes), already made. judge -> (promise kept, evidence)."""
    active = list(passes)
    kept, evidence = judge(candidate)
    dropped: list[tuple[Pass, Evidence]] = []
    while not kept and active:
        good, bad, bad_evidence = 0, len(active), evidence  # prefix `good` keeps it, prefix `bad` breaks it
        while bad - good > 1:
            middle = (good + bad) // 2
            middle_kept, middle_evidence = judge(build(active[:middle]))
            if middle_kept:
                good = middle
            else:
                bad, bad_evidence = middle, middle_evidence
        dropped.append((active.pop(bad - 1), bad_evidence))
        candidate = build(active)
        kept, evidence = judge(candidate)
    return Kept(candidate, evidence, active, dropped)
