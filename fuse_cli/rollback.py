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
    # each pass with the judge's word on the smallest prefix it broke (followed by the trailing
    # passes where they were judged with it), at the settings where the whole candidate broke
    dropped: list[tuple[Pass, Evidence]]


def drop_breaking_passes(passes: Sequence[Pass], candidate: Candidate, build: Callable[[list[Pass]], Candidate],
                         judge: Callable[[Candidate, Evidence | None], tuple[bool, Evidence]],
                         trailing: Callable[[Pass], bool] = lambda p: False) -> Kept[Candidate, Evidence]:
    """`candidate` is build(passes), already made. judge(candidate, whole) -> (promise kept,
    evidence): `whole` is None for a whole candidate, and the whole candidate's evidence when a
    prefix is judged in the bisection (judge the prefix against that break only).

    `trailing` passes run after all the others and only take back what those leave (the peak
    guard's model passes: a node order, the planner's declarations). Where the others keep the
    promise without them, only they are bisected. Where the others break it, each prefix of the
    others is judged with them after it (a pass whose growth they take back is not blamed for a
    later pass's), unless they break it on their own; then plain prefixes."""
    active = list(passes)
    kept, evidence = judge(candidate, None)
    dropped: list[tuple[Pass, Evidence]] = []
    while not kept and active:
        lead = [p for p in active if not trailing(p)]
        tail = [p for p in active if trailing(p)]
        order = lead + tail  # how build runs them: the trailing passes after every other
        after = []  # what follows each prefix of `order`
        good, bad, bad_evidence = 0, len(order), evidence  # prefix `good` keeps it, prefix `bad` breaks it
        if tail:
            lead_kept, lead_evidence = judge(build(lead), evidence)
            if lead_kept:
                good = len(lead)  # the trailing passes break it: bisect them, every other pass in
            elif judge(build(tail), evidence)[0]:
                order, after, bad = lead, tail, len(lead)  # lead + tail: the whole candidate
            else:
                bad, bad_evidence = len(lead), lead_evidence
        while bad - good > 1:
            middle = (good + bad) // 2
            middle_kept, middle_evidence = judge(build(order[:middle] + after), evidence)
            if middle_kept:
                good = middle
            else:
                bad, bad_evidence = middle, middle_evidence
        culprit = order[bad - 1]
        active = [p for p in active if p is not culprit]
        dropped.append((culprit, bad_evidence))
        candidate = build(active)
        kept, evidence = judge(candidate, None)
    return Kept(candidate, evidence, active, dropped)
