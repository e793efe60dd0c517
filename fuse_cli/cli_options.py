"""What every `fuse` command shares: its options, turning them into a FuseConfig, the one way
results are written (stdout for `-`, else a file, a one-line error when it cannot), and the guard
that turns exceptions into one line and an exit code."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import click
from rich.console import Console

from fuse_cli.config import SCHEDULE_FOR, load_config, parse_dims, parse_input_shapes, split_names
from fuse_cli.errors import EXIT_INTERNAL, EXIT_USAGE, FuseError, UsageError
from fuse_cli.passes import TARGETS
from fuse_cli.report.files import write_text_atomically
from fuse_cli.report.text import visible
from fuse_cli.verify import parse_int_ranges

dim_option = functools.partial(click.option, "--dim", "dims", multiple=True, metavar="NAME=VALUE")
int_range_option = functools.partial(click.option, "--int-range", "int_ranges", multiple=True, metavar="INPUT=LOW:HIGH")
json_option = functools.partial(click.option, "--json", "json_path", default=None, metavar="PATH|-")
markdown_option = functools.partial(click.option, "--markdown", "markdown_path", default=None, metavar="PATH|-")
seed_option = click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
debug_option = click.option("--debug", is_flag=True, help="Show tracebacks.")


def fail(message: str, code: int) -> None:
    click.echo(f"fuse: error: {visible(message)}", err=True)  # one line: a name's newline is shown as \\n
    sys.exit(code)


def guarded(func):
    """One line on stderr and a meaningful exit code instead of a traceback (--debug shows it)."""

    @functools.wraps(func)
    def wrapper(*args, debug: bool = False, **kwargs):
        try:
            return func(*args, **kwargs)
        except FuseError as exc:
            if debug:
                raise
            fail(str(exc), exc.exit_code)
        except (KeyboardInterrupt, click.exceptions.Exit, click.ClickException):
            raise
        except MemoryError:
            if debug:
                raise
            fail("out of memory: the model needs more than this machine gives (see --max-memory)", EXIT_USAGE)
        except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
            if debug:
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            fail(f"internal error ({type(exc).__name__}: {first}); rerun with --debug for the traceback", EXIT_INTERNAL)

    return wrapper



def fusion_options(func):
    """Options shared by every command that runs passes."""
    options = [
        click.option("--target", type=click.Choice(TARGETS), default=None,
                     help="Operators the output may use: onnx (standard only, default) or an onnxruntime target."),
        click.option("--passes", "passes", default=None, metavar="A,B",
                     help="Run only these passes (comma-separated)."),
        click.option("--disable", default=None, metavar="A,B", help="Skip these passes (comma-separated)."),
        dim_option(help="Bind a symbolic dimension for the memory estimate, verification and --measure (repeatable); "
                        "a dim with no usable name ('?', -1, none) by position: x.dim2=48."),
        click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:1x3x224x224",
                     help="Give an input's full shape, the same binding as --dim (repeatable)."),
        click.option("--freeze-inputs", is_flag=True, default=None,
                     help="Treat initializers listed as graph inputs as constants and drop them from the inputs."),
        click.option("--fold-limit", type=click.FloatRange(min=0), default=None, metavar="MB",
                     help="Largest tensor constant folding may create (default 64 MB)."),
        click.option("--upgrade-opset", type=int, default=None, metavar="N",
                     help="Convert the model to opset N first (onnx version converter), so newer fused ops apply."),
        click.option("--verify/--no-verify", default=None,
                     help="Compare outputs with the original in onnxruntime (default on); "
                          "roll back passes that break them."),
        int_range_option(help="Verification: range of an integer input's random values, high exclusive "
                              "(default: what the graph implies, e.g. an embedding's row count; 0:2 for masks; "
                              "else 0:10)."),
        click.option("--rtol", type=click.FloatRange(min=0), default=None,
                     help="Relative tolerance for verification (default by dtype)."),
        click.option("--atol", type=click.FloatRange(min=0), default=None,
                     help="Absolute tolerance for verification (default by dtype)."),
        click.option("--allow-mismatch", is_flag=True, default=None,
                     help="Exit 0 even when a pass had to be rolled back."),
        click.option("--allow-peak-growth", is_flag=True, default=None,
                     help="Keep rewrites that raise the estimated peak activation memory above the original's "
                          "(by default the peak guard leaves them out and says why)."),
        click.option("--schedule-for", type=click.Choice(SCHEDULE_FOR), default=None,
                     help="Which execution order the `schedule` pass lowers the peak for: onnxruntime's "
                          "(default for onnxruntime targets), the stored order, or both (default for --target onnx)."),
        click.option("--require-verified", is_flag=True, default=None,
                     help="CI: exit 1 unless verification confirmed the output (not unverifiable, not inconclusive)."),
        click.option("--fail-on-fusable", is_flag=True, default=None,
                     help="CI gate: exit 1 when any pass would still fire (the model was not optimized)."),
        click.option("--max-peak", type=click.FloatRange(min=0), default=None, metavar="MB",
                     help="CI gate: exit 1 when the estimated peak activation memory exceeds MB."),
        click.option("--fail-on-near-miss", default=None, metavar="PASS[,PASS]",
                     help="CI gate: exit 1 when these passes report a near-miss."),
        click.option("--max-memory", type=click.FloatRange(min=1), default=None, metavar="MB",
                     help="Stop with exit 2 when the run holds more memory than MB (default: 75% of RAM)."),
        click.option("--measure", is_flag=True, default=None,
                     help="Also run both models in onnxruntime and measure the real peak activation memory."),
        json_option(help="Write the report as JSON."),
        markdown_option(help="Write the report as Markdown."),
        click.option("--plot", "plot_path", default=None, metavar="PATH.svg",
                     help="Write the memory timeline (before/after, peaks marked) as SVG (.png needs matplotlib)."),
        click.option("--html", "html_path", default=None, metavar="PATH", help="Write a self-contained HTML report."),
        debug_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func



def progress_options(func):
    """What a run shows on stderr besides its result: the live status line, its log form, the timings."""
    options = [
        click.option("--timings", "show_timings", is_flag=True,
                     help="Also print where the time went: each step, each pass (matching and rewriting apart), "
                          "verification per setting, peak memory (the JSON report always has them)."),
        click.option("-q", "--quiet", is_flag=True, help="No status line or progress bar on stderr."),
        click.option("-v", "--verbose", is_flag=True,
                     help="A line on stderr as each step ends (a terminal also gets the live status line)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def config_from_options(target, passes, disable, dims, input_shapes, freeze_inputs, fold_limit, upgrade_opset,
                        verify, int_ranges, rtol, atol, allow_mismatch, allow_peak_growth, require_verified,
                        fail_on_fusable, max_peak, fail_on_near_miss, measure, schedule_for, max_memory):
    base = load_config()
    return base.with_overrides(
        target=target,
        passes=split_names(passes) if passes is not None else None,
        disable=split_names(disable) if disable is not None else None,
        dims={**base.dims, **parse_dims(dims)} if dims else None,
        input_shapes=parse_input_shapes(input_shapes) if input_shapes else None,
        freeze_inputs=freeze_inputs,
        fold_limit_bytes=int(fold_limit * 2**20) if fold_limit is not None else None,
        upgrade_opset=upgrade_opset,
        verify=verify,
        int_ranges=parse_int_ranges(int_ranges) if int_ranges else None,
        rtol=rtol,
        atol=atol,
        allow_mismatch=allow_mismatch,
        allow_peak_growth=allow_peak_growth,
        require_verified=require_verified,
        fail_on_fusable=fail_on_fusable,
        max_peak_bytes=int(max_peak * 2**20) if max_peak is not None else None,
        fail_on_near_miss=split_names(fail_on_near_miss) if fail_on_near_miss is not None else None,
        measure=measure,
        schedule_for=schedule_for,
        max_memory_bytes=int(max_memory * 2**20) if max_memory is not None else None,
    )



def console(stderr: bool = False) -> Console:
    """A terminal gets its own width; logs and pipes get COLUMNS where it is set, else 120 columns
    rather than rich's 80."""
    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = Console(stderr=stderr, width=120)
    return console



def check_writable(*paths: str | None) -> None:
    """Before any work: every output's folder exists (a missing one is bad input, exit 2)."""
    for path in paths:
        if path is not None and path != "-" and not Path(path).parent.is_dir():
            raise FuseError(f"{path}: cannot write (its folder {Path(path).parent} does not exist)")


def check_report_paths(reports: Iterable[str | None], models: Iterable[str | os.PathLike | None]) -> None:
    """Before any work: no report may be written over a model the run reads or writes, whether
    named as given, through a symlink or as a hard link (same device and inode)."""
    models = [Path(m) for m in models if m is not None]
    for report in reports:
        if report is None or report == "-":
            continue
        for model in models:
            if _same_file(Path(report), model):
                raise UsageError(f"{report}: is the model {model}; a report cannot be written over a model")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet: compare where each would be
        return a.resolve() == b.resolve()


def write_output(path: str, text: str) -> None:
    """`-`: stdout; else the file, or a one-line error (a missing folder is bad input, exit 2)."""
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        write_text_atomically(path, text)
    except OSError as exc:
        raise FuseError(f"{path}: cannot write ({exc.strerror or exc})") from exc


def emit(result, show: Callable[[object, Console], None], texts: Iterable[tuple[str | None, Callable]] = (),
         files: Iterable[tuple[str | None, Callable]] = ()) -> None:
    """The one output path: the rich view (on stderr when a text goes to stdout), then each text
    renderer's result to its path, then each file writer (the SVG plot, the HTML page) to its own."""
    texts = [(path, render) for path, render in texts if path is not None]
    show(result, console(stderr=any(path == "-" for path, _ in texts)))
    for path, writer in files:
        if path is not None:
            try:
                writer(result, path)
            except OSError as exc:
                raise FuseError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    for path, render in texts:
        write_output(path, render(result))
