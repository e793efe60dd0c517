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
                         judge: Callable[[Candidate, Evidence | None], tuple[bool, Evidence]],
                         trailing: Callable[[Pass], bool] = lambda p: False) -> Kept[Candidate, Evidence]:
    """`candidate` is build(passes), already made. judge(candidate, whole) -> (promise kept,
    evidence): `whole` is None for a whole candidate, and the whole candidate's evidence when a
    prefix is judged in the bisection (judge the prefix against that break only).

    `trailing` passes run after all the others and only take back what those leave (the peak
    guard's model passes: a node order, the planner's declarations). Where the others break the
    promise without them too, each prefix of the others is judged with them after it: a pass whose
    growth they take back is not blamed for the next pass's. Else they are bisected themselves."""
    active = list(passes)
    kept, evidence = judge(candidate, None)
    dropped: list[tuple[Pass, Evidence]] = []
    while not kept and active:
        lead = [p for p in active if not trailing(p)]
        tail = [p for p in active if trailing(p)]
        if tail and not judge(build(lead), evidence)[0] and judge(build(tail), evidence)[0]:
            order, prefix = lead, (lambda k: lead[:k] + tail)
        else:  # the trailing passes break it, or none are given: plain prefixes
            order, prefix = active, (lambda k: active[:k])
        good, bad, bad_evidence = 0, len(order), evidence  # prefix `good` keeps it, prefix `bad` breaks it
        while bad - good > 1:
            middle = (good + bad) // 2
            middle_kept, middle_evidence = judge(build(prefix(middle)), evidence)
            if middle_kept:
                good = middle
            else:
                bad, bad_evidence = middle, middle_evidence
        culprit = order[bad - 1]
        active.remove(culprit)
        dropped.append((culprit, bad_evidence))
        candidate = build(active)
        kept, evidence = judge(candidate, None)
    return Kept(candidate, evidence, active, dropped)
