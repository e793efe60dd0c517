"""Where a run's time goes: the steps the library announces, timed for the report, and shown to
whoever watches (the command line's live status line, report/status_line.py).

The library announces its steps through this module's functions (`with step("shape tables"):`,
`update("pass 3 of 40: conv-bn")`, `pass_ran(...)`); they reach the recorder of the run in
progress (`Steps.recording`), and do nothing when no run records (a test calling `fuse()`
directly). Nothing here knows about terminals: a watcher reads `Steps.now()` when it redraws and
may be told when a step ends.

The steps of the run's own thread that are not inside another follow one another and cover the
run, so their seconds add up to its wall time. A step inside another (the original's run at one
setting, inside verification) is a part of it. A step on another thread (the original's runs
beside the pipeline, promises.py) is `beside`: its time overlaps the others'.
"""

from __future__ import annotations

import contextlib
import contextvars
import resource
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

BESIDE = "beside"  # StepTime.within of a step that ran on another thread, overlapping the run's


@dataclass(frozen=True)
class StepTime:
    """Every time one step ran, added up. `within`: the step it is part of (None: a step of the
    run itself, which with the others adds up to the wall time; BESIDE: on another thread)."""

    name: str
    seconds: float
    count: int
    within: str | None = None
    peak_rss_bytes: int = 0  # the process's resident high-water mark when it last ended


@dataclass(frozen=True)
class PassTime:
    """One pass over all its runs (a pipeline runs it once a round, and again per candidate a
    bisection builds). A pattern pass's time splits into finding and checking matches, and
    building and splicing the replacements; a pass that walks the graph itself does not say."""

    name: str
    runs: int
    seconds: float
    matching_seconds: float | None = None
    rewriting_seconds: float | None = None


@dataclass(frozen=True)
class SettingTime:
    """One run of a model at one shape setting in verification, timed from fuse's side of the
    worker process: the session built and run, the inputs and outputs sent."""

    model: str  # "original" or "candidate"
    setting: tuple[tuple[str, int], ...]
    seconds: float
    at_once: int = 1  # settings run together in these seconds (a small candidate's, on threads)


@dataclass(frozen=True)
class Timings:
    wall_seconds: float
    steps: tuple[StepTime, ...]
    passes: tuple[PassTime, ...] = ()
    verification: tuple[SettingTime, ...] = ()
    peak_rss_bytes: int = 0  # fuse's process
    worker_peak_rss_bytes: int | None = None  # onnxruntime's worker process (None: none ran)


@dataclass(frozen=True)
class Now:
    """What the run is doing, for a status line."""

    step: str  # the open steps of the run's thread, outermost first, joined by " · "
    detail: str
    nbytes: int | None  # a size the step works on (what `write` writes)
    step_seconds: float  # since the innermost open step began
    run_seconds: float
    beside: str  # the steps open on another thread, with the innermost's detail ("" when none)


@dataclass
class _Open:
    name: str
    started: float
    detail: str = ""
    nbytes: int | None = None


@dataclass
class _Total:
    seconds: float = 0.0
    count: int = 0
    peak_rss_bytes: int = 0


@dataclass
class _PassTotal:
    runs: int = 0
    seconds: float = 0.0
    matching: float | None = None
    rewriting: float | None = None


class Steps:
    """One run's recorder, made on the run's thread as the run begins (its clock starts then).
    `on_step_end(name, seconds, within)` is called as each step ends."""

    def __init__(self, on_step_end: Callable[[str, float, str | None], None] | None = None):
        self.on_step_end = on_step_end
        self._started = time.perf_counter()
        self._owner = threading.get_ident()  # the run's thread
        self._open: dict[int, list[_Open]] = {}  # per thread, outermost first
        self._steps: dict[tuple[str | None, str], _Total] = {}
        self._passes: dict[str, _PassTotal] = {}
        self._settings: list[SettingTime] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def recording(self) -> Iterator[Steps]:
        """The library's part of the run: the module's functions reach this recorder until it ends."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        stack = self._open.setdefault(threading.get_ident(), [])
        stack.append(_Open(name, time.perf_counter()))
        try:
            yield
        finally:
            opened = stack.pop()
            seconds = time.perf_counter() - opened.started
            within = stack[-1].name if stack else None if threading.get_ident() == self._owner else BESIDE
            with self._lock:
                total = self._steps.setdefault((within, name), _Total())
                total.seconds += seconds
                total.count += 1
                total.peak_rss_bytes = peak_rss_bytes()
            if self.on_step_end is not None:
                self.on_step_end(name, seconds, within)

    def update(self, detail: str, nbytes: int | None = None) -> None:
        stack = self._open.get(threading.get_ident())
        if stack:
            stack[-1].detail, stack[-1].nbytes = detail, nbytes

    def pass_ran(self, name: str, seconds: float, rewriting: float | None = None) -> None:
        total = self._passes.setdefault(name, _PassTotal())
        total.runs += 1
        total.seconds += seconds
        if rewriting is not None:
            total.rewriting = (total.rewriting or 0.0) + rewriting
            total.matching = (total.matching or 0.0) + seconds - rewriting

    def settings_ran(self, model: str, settings: Sequence[Mapping[str, int]], seconds: float) -> None:
        with self._lock:
            self._settings += [SettingTime(model, tuple(s.items()), seconds, len(settings)) for s in settings]

    def now(self) -> Now:
        clock = time.perf_counter()
        main = list(self._open.get(self._owner, ()))
        beside = next((list(stack) for thread, stack in list(self._open.items())
                       if thread != self._owner and stack), [])
        return Now(
            step=" · ".join(o.name for o in main),
            detail=main[-1].detail if main else "",
            nbytes=main[-1].nbytes if main else None,
            step_seconds=clock - main[-1].started if main else 0.0,
            run_seconds=clock - self._started,
            beside=_described(beside),
        )

    def timings(self, worker_peak_rss_bytes: int | None = None) -> Timings:
        """What was recorded so far, the wall time up to now."""
        return Timings(
            wall_seconds=time.perf_counter() - self._started,
            steps=tuple(StepTime(name, t.seconds, t.count, within, t.peak_rss_bytes)
                        for (within, name), t in self._steps.items()),
            passes=tuple(PassTime(name, t.runs, t.seconds, t.matching, t.rewriting)
                         for name, t in self._passes.items()),
            verification=tuple(self._settings),
            peak_rss_bytes=peak_rss_bytes(),
            worker_peak_rss_bytes=worker_peak_rss_bytes,
        )


def _described(stack: list[_Open]) -> str:
    text = " · ".join(o.name for o in stack)
    return f"{text}: {stack[-1].detail}" if stack and stack[-1].detail else text


def peak_rss_bytes() -> int:
    """This process's resident high-water mark (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def high_water_mark(pid: int | None) -> int | None:
    """Another process's resident high-water mark (None: no such process)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


_CURRENT: contextvars.ContextVar[Steps | None] = contextvars.ContextVar("fuse_steps", default=None)


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """A step of the run in progress (nothing without one)."""
    steps = _CURRENT.get()
    if steps is None:
        yield
        return
    with steps.step(name):
        yield


def update(detail: str, nbytes: int | None = None) -> None:
    """What the innermost open step of this thread is doing now."""
    steps = _CURRENT.get()
    if steps is not None:
        steps.update(detail, nbytes)


def pass_ran(name: str, seconds: float, rewriting: float | None = None) -> None:
    steps = _CURRENT.get()
    if steps is not None:
        steps.pass_ran(name, seconds, rewriting)


@contextlib.contextmanager
def model_run(model: str, settings: Sequence[Mapping[str, int]], where: str) -> Iterator[None]:
    """Verification runs `model` ("original" or "candidate") at `settings` (one, or several at
    once): a step of its own, `where` says which setting for the status line."""
    steps = _CURRENT.get()
    if steps is None:
        yield
        return
    with steps.step(model):
        steps.update(where)
        started = time.perf_counter()
        try:
            yield
        finally:
            steps.settings_ran(model, settings, time.perf_counter() - started)


def carried(function: Callable[[], T]) -> Callable[[], T]:
    """`function`, to run on another thread as part of this run (a thread starts without the
    caller's context, so without its recorder)."""
    context = contextvars.copy_context()
    return lambda: context.run(function)
