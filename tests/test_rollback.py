"""rollback.drop_breaking_passes: the bisection blames the pass that breaks the promise the way the
whole pipeline breaks it, not a pass whose prefix breaks it in a way a later pass repairs."""

from __future__ import annotations

from dataclasses import dataclass

from fuse_cli.rollback import drop_breaking_passes


@dataclass(frozen=True)
class Step:
    name: str


RAISES_LARGE = Step("raises-large")   # grows the peak at the large setting, until `repairs` runs
BREAKS_SMALL = Step("breaks-small")   # grows it at the small setting, for good
REPAIRS = Step("repairs")             # lowers the large setting's peak again
UNRELATED = Step("unrelated")


def growth(passes: tuple[Step, ...]) -> set[str]:
    grown = set()
    if RAISES_LARGE in passes and (REPAIRS not in passes or passes.index(REPAIRS) < passes.index(RAISES_LARGE)):
        grown.add("large")
    if BREAKS_SMALL in passes:
        grown.add("small")
    return grown


def judge_by(growth_of):
    """A judge in drop_breaking_passes' form: the settings a candidate grows at, only those the
    whole candidate grew at when it judges a prefix."""
    def judge(candidate: tuple[Step, ...], whole: set[str] | None) -> tuple[bool, set[str]]:
        grown = growth_of(candidate) & (whole if whole is not None else {"small", "large"})
        return not grown, grown
    return judge


judge = judge_by(growth)


def test_a_prefix_that_breaks_only_where_the_whole_pipeline_does_not_is_not_blamed():
    passes = [UNRELATED, RAISES_LARGE, BREAKS_SMALL, REPAIRS]
    assert growth(tuple(passes[:2])) == {"large"}  # the prefix ending in raises-large breaks, at large
    kept = drop_breaking_passes(passes, tuple(passes), tuple, judge)
    assert [p for p, _ in kept.dropped] == [BREAKS_SMALL]
    assert kept.dropped[0][1] == {"small"}
    assert kept.active == [UNRELATED, RAISES_LARGE, REPAIRS] and kept.candidate == tuple(kept.active)
    assert judge(kept.candidate, None) == (True, set())


def test_a_pass_breaking_the_whole_pipeline_where_nothing_repairs_it_is_dropped():
    passes = [UNRELATED, RAISES_LARGE, BREAKS_SMALL]
    kept = drop_breaking_passes(passes, tuple(passes), tuple, judge)
    # the whole pipeline breaks at both settings: the first prefix to break (at large) goes first
    assert [(p, evidence) for p, evidence in kept.dropped] == [(RAISES_LARGE, {"large"}), (BREAKS_SMALL, {"small"})]
    assert kept.active == [UNRELATED]


# A pass that raises the large setting's peak until the trailing model pass (a node order) takes it
# back, a pass that raises it for good, and that trailing pass.
TRANSIENT = Step("transient")
FOR_GOOD = Step("for-good")
ORDER = Step("order")


def transient_growth(passes: tuple[Step, ...]) -> set[str]:
    grown = set()
    if TRANSIENT in passes and ORDER not in passes or FOR_GOOD in passes:
        grown.add("large")
    if ORDER in passes and UNRELATED not in passes:  # the order pass misjudges a graph without `unrelated`
        grown.add("small")
    return grown


transient_judge = judge_by(transient_growth)


def test_a_pass_whose_growth_the_trailing_passes_take_back_is_not_blamed_for_a_later_ones():
    passes = [UNRELATED, TRANSIENT, FOR_GOOD, ORDER]
    plain = drop_breaking_passes(passes, tuple(passes), tuple, transient_judge)
    assert [p for p, _ in plain.dropped] == [TRANSIENT, FOR_GOOD]  # prefixes without the order blame both
    kept = drop_breaking_passes(passes, tuple(passes), tuple, transient_judge, trailing=lambda p: p is ORDER)
    assert [p for p, _ in kept.dropped] == [FOR_GOOD]
    assert kept.active == [UNRELATED, TRANSIENT, ORDER] and transient_judge(kept.candidate, None)[0]


def test_a_trailing_pass_that_breaks_the_promise_itself_is_dropped():
    passes = [TRANSIENT, ORDER]  # no `unrelated`: the order pass grows the small setting
    kept = drop_breaking_passes(passes, tuple(passes), tuple, transient_judge, trailing=lambda p: p is ORDER)
    assert [p for p, _ in kept.dropped] == [ORDER, TRANSIENT]
    assert kept.active == [] and transient_judge(kept.candidate, None)[0]


BAD_ORDER = Step("bad-order")  # a trailing pass that grows the large setting whatever it runs after


def bad_order_growth(passes: tuple[Step, ...]) -> set[str]:
    repaired = RAISES_LARGE not in passes or REPAIRS in passes
    return {"large"} if not repaired or BAD_ORDER in passes else set()


bad_order_judge = judge_by(bad_order_growth)


def test_where_the_other_passes_keep_the_promise_only_the_trailing_ones_are_bisected():
    passes = [RAISES_LARGE, UNRELATED, REPAIRS, BAD_ORDER]
    kept = drop_breaking_passes(passes, tuple(passes), tuple, bad_order_judge, trailing=lambda p: p is BAD_ORDER)
    assert [p for p, _ in kept.dropped] == [BAD_ORDER]
    assert kept.active == [RAISES_LARGE, UNRELATED, REPAIRS]
