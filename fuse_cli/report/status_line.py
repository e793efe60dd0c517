"""What a user sees while one model runs: a live status line on a terminal (stderr), gone when
the run ends; in a log (stderr not a terminal), with --verbose, a line as each step ends. The
steps themselves are recorded by fuse_cli/progress.py, which knows nothing of terminals.

stdout never carries any of it: it is for results (`--json -`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console, RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from fuse_cli.progress import BESIDE, Steps
from fuse_cli.report.render import human_bytes
from fuse_cli.report.text import visible

REFRESHES_PER_SECOND = 8


@contextlib.contextmanager
def watching(steps: Steps, console: Console, *, quiet: bool = False, verbose: bool = False) -> Iterator[None]:
    """Show `steps` on `console` (a stderr console) while the block runs."""
    if quiet or not (console.is_terminal or verbose):
        yield
        return
    if verbose:
        steps.on_step_end = lambda name, seconds, within: console.print(
            Text(step_ended_line(name, seconds, within), no_wrap=True, overflow="ellipsis"))
    try:
        if not console.is_terminal:
            yield
            return
        # stdout is left alone (a result written there must not pass through the status's console);
        # what is printed on stderr meanwhile (onnx-graphsurgeon's warnings) goes above the line
        with Live(_StatusLine(steps), console=console, transient=True, refresh_per_second=REFRESHES_PER_SECOND,
                  redirect_stdout=False, redirect_stderr=True):
            yield
    finally:
        steps.on_step_end = None


def step_ended_line(name: str, seconds: float, within: str | None) -> str:
    where = "beside the run: " if within == BESIDE else f"{within} › " if within else ""
    return visible(f"fuse: {where}{name}: {seconds:.2f} s")


def status_text(steps: Steps) -> str:
    """`pipeline · passes: pass 12 of 48: layer-norm  0:02 (run 0:14)`, and what runs beside it."""
    now = steps.now()
    text = now.step or "working"  # between two steps
    if now.detail:
        text += f": {now.detail}"
    if now.nbytes is not None:
        text += f" ({human_bytes(now.nbytes)})"
    text += f"  {_clock(now.step_seconds)} (run {_clock(now.run_seconds)})"
    if now.beside:
        text += f"; beside it: {now.beside}"
    return visible(text)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}:{seconds:02d}"


class _StatusLine:
    """A spinner and the run's status, read afresh at each refresh (from Live's thread)."""

    def __init__(self, steps: Steps):
        self.steps = steps
        self.spinner = Spinner("dots", style="cyan")

    def __rich__(self) -> RenderableType:
        self.spinner.update(text=Text(f"fuse {status_text(self.steps)}", no_wrap=True, overflow="ellipsis"))
        return self.spinner
