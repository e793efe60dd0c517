"""The `fuse` command line: parse, call the library, render, exit. Nothing else lives here.

stdout carries results (the table, or JSON/Markdown when written to `-`); errors go to stderr as
one line. Exit codes: 0 ok, 1 a check failed, 2 bad input or usage, 3 an internal error.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click
from rich.console import Console

from fuse_cli import __version__, api
from fuse_cli.bench import GRAPH_OPTIMIZATION, PROVIDERS
from fuse_cli.config import load_config, parse_dims, parse_input_shapes, split_names
from fuse_cli.verify import parse_int_ranges
from fuse_cli.errors import FuseError, UsageError
from fuse_cli.graph.io import load_model
from fuse_cli.passes import REGISTRY, TARGETS, pipeline_for
from fuse_cli.report.model import Report
from fuse_cli.report.html import write_html
from fuse_cli.report.plot import write_plot
from fuse_cli.report.render import render_json, render_markdown, render_rich

EXIT_INTERNAL = 3


def _fail(message: str, code: int) -> None:
    click.echo(f"fuse: error: {message}", err=True)
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
            _fail(str(exc), exc.exit_code)
        except (KeyboardInterrupt, click.exceptions.Exit, click.ClickException):
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
            if debug:
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            _fail(f"internal error ({type(exc).__name__}: {first}); rerun with --debug for the traceback", EXIT_INTERNAL)

    return wrapper


def fusion_options(func):
    """Options shared by every command that runs passes."""
    options = [
        click.option("--target", type=click.Choice(TARGETS), default=None,
                     help="Operators the output may use: onnx (standard only, default) or an onnxruntime target."),
        click.option("--passes", "passes", default=None, metavar="A,B", help="Run only these passes (comma-separated)."),
        click.option("--disable", default=None, metavar="A,B", help="Skip these passes (comma-separated)."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
                     help="Bind a symbolic dimension for the memory estimate (repeatable)."),
        click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME:1x3x224x224",
                     help="Give an input's full shape for the memory estimate (repeatable)."),
        click.option("--freeze-inputs", is_flag=True, default=None,
                     help="Treat initializers listed as graph inputs as constants and drop them from the inputs."),
        click.option("--fold-limit", type=click.FloatRange(min=0), default=None, metavar="MB",
                     help="Largest tensor constant folding may create (default 64 MB)."),
        click.option("--upgrade-opset", type=int, default=None, metavar="N",
                     help="Convert the model to opset N first (onnx version converter), so newer fused ops apply."),
        click.option("--verify/--no-verify", default=None,
                     help="Compare outputs with the original in onnxruntime (default on); roll back passes that break them."),
        click.option("--int-range", "int_ranges", multiple=True, metavar="INPUT=LOW:HIGH",
                     help="Verification: range of an integer input's random values, high exclusive "
                          "(default: what the graph implies, e.g. an embedding's row count; 0:2 for masks; else 0:10)."),
        click.option("--rtol", type=click.FloatRange(min=0), default=None,
                     help="Relative tolerance for verification (default by dtype)."),
        click.option("--atol", type=click.FloatRange(min=0), default=None,
                     help="Absolute tolerance for verification (default by dtype)."),
        click.option("--allow-mismatch", is_flag=True, default=None,
                     help="Exit 0 even when a pass had to be rolled back."),
        click.option("--allow-peak-growth", is_flag=True, default=None,
                     help="Keep rewrites that raise the estimated peak activation memory above the original's "
                          "(by default the peak guard leaves them out and says why)."),
        click.option("--require-verified", is_flag=True, default=None,
                     help="CI: exit 1 unless verification confirmed the output (not unverifiable, not inconclusive)."),
        click.option("--fail-on-fusable", is_flag=True, default=None,
                     help="CI gate: exit 1 when any pass would still fire (the model was not optimized)."),
        click.option("--max-peak", type=click.FloatRange(min=0), default=None, metavar="MB",
                     help="CI gate: exit 1 when the estimated peak activation memory exceeds MB."),
        click.option("--fail-on-near-miss", default=None, metavar="PASS[,PASS]",
                     help="CI gate: exit 1 when these passes report a near-miss."),
        click.option("--measure", is_flag=True, default=None,
                     help="Also run both models in onnxruntime and measure the real peak activation memory."),
        click.option("--json", "json_path", default=None, metavar="PATH|-", help="Write the report as JSON."),
        click.option("--markdown", "markdown_path", default=None, metavar="PATH|-", help="Write the report as Markdown."),
        click.option("--plot", "plot_path", default=None, metavar="PATH.svg",
                     help="Write the memory timeline (before/after, peaks marked) as SVG (.png needs matplotlib)."),
        click.option("--html", "html_path", default=None, metavar="PATH", help="Write a self-contained HTML report."),
        click.option("--debug", is_flag=True, help="Show tracebacks."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _config(target, passes, disable, dims, input_shapes, freeze_inputs, fold_limit, upgrade_opset, verify, int_ranges,
            rtol, atol, allow_mismatch, allow_peak_growth, require_verified, fail_on_fusable, max_peak, fail_on_near_miss, measure):
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
    )


def _emit(report: Report, json_path: str | None, markdown_path: str | None, plot_path: str | None = None,
          html_path: str | None = None) -> None:
    to_stdout = "-" in (json_path, markdown_path)
    render_rich(report, _console(stderr=to_stdout))
    for path, write in ((plot_path, write_plot), (html_path, write_html)):
        if path is not None:
            try:
                write(report, path)
            except OSError as exc:
                raise FuseError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    for path, text in ((json_path, render_json), (markdown_path, render_markdown)):
        if path is None:
            continue
        if path == "-":
            click.echo(text(report), nl=False)
        else:
            try:
                Path(path).write_text(text(report), encoding="utf-8")
            except OSError as exc:
                raise FuseError(f"{path}: cannot write report ({exc.strerror or exc})") from exc


def _console(stderr: bool = False) -> Console:
    """A terminal gets its own width; logs and pipes get 120 columns rather than rich's 80."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=120)
    return console


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fuse")
def cli() -> None:
    """fuse: fuse ONNX operators and audit activation memory."""


@cli.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL... | DIR")
@click.option("-o", "--output", default=None, metavar="PATH", help="Where to write (default: <stem>.fused.onnx beside MODEL).")
@click.option("--out-dir", default=None, metavar="DIR", help="Batch: write each <stem>.fused.onnx into DIR.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Batch: parallel processes (default: up to 4).")
@click.option("--in-place", is_flag=True, help="Allow writing over MODEL.")
@click.option("--external-data", is_flag=True, default=None, help="Store weights in a side .data file.")
@fusion_options
@guarded
def optimize(models, output, out_dir, jobs, in_place, external_data, json_path, markdown_path, plot_path, html_path,
             **options):
    """Fuse MODEL and write the optimized model; several models or a folder run as a batch."""
    config = _config(**options).with_overrides(external_data=external_data)
    if len(models) == 1 and not Path(models[0]).is_dir() and out_dir is None:
        result = api.optimize(models[0], config, output, in_place=in_place)
        _emit(result.report, json_path, markdown_path, plot_path, html_path)
        sys.exit(result.report.exit_code)
    if output or in_place or markdown_path or plot_path or html_path:
        raise UsageError("-o, --in-place, --markdown, --plot and --html take one model; use --out-dir for a batch")
    sys.exit(_run_batch(models, config, out_dir, jobs, json_path))


def _run_batch(models, config, out_dir, jobs, json_path, dry_run: bool = False) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fuse_cli.batch import batch_exit_code, default_jobs, expand_models, optimize_many
    from fuse_cli.report.render import render_batch_json, render_batch_rich

    paths = expand_models(models)
    progress = Progress(TextColumn("[bold]fuse[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    with progress:
        task = progress.add_task("auditing" if dry_run else "optimizing", total=len(paths))
        items = optimize_many(paths, config, Path(out_dir) if out_dir else None, jobs or default_jobs(),
                              on_done=lambda item: progress.advance(task), dry_run=dry_run)
    render_batch_rich(items, _console(stderr=json_path == "-"))
    if json_path == "-":
        click.echo(render_batch_json(items), nl=False)
    elif json_path:
        Path(json_path).write_text(render_batch_json(items), encoding="utf-8")
    return batch_exit_code(items)


@cli.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL... | DIR")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Several models: parallel processes.")
@fusion_options
@guarded
def report(models, jobs, json_path, markdown_path, plot_path, html_path, **options):
    """Memory audit and dry run: what fusion would do to MODEL, without writing the model."""
    config = _config(**options)
    if len(models) == 1 and not Path(models[0]).is_dir():
        result = api.optimize(models[0], config, dry_run=True)
        _emit(result.report, json_path, markdown_path, plot_path, html_path)
        sys.exit(result.report.exit_code)
    if markdown_path or plot_path or html_path:
        raise UsageError("--markdown, --plot and --html take one model")
    sys.exit(_run_batch(models, config, None, jobs, json_path, dry_run=True))


@cli.command(name="verify")
@click.argument("original")
@click.argument("optimized")
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
              help="Value for a symbolic dimension (default: distinct primes, at two settings).")
@click.option("--int-range", "int_ranges", multiple=True, metavar="INPUT=LOW:HIGH",
              help="Range for an integer input's random values, high exclusive (default: what the graph implies).")
@click.option("--inputs", "inputs_path", default=None, metavar="FILE.npz|DIR",
              help="Real inputs: a .npz file, or a folder of onnx TensorProto .pb files named after the inputs.")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance (default by dtype: fp32 1e-4).")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance (default by dtype: fp32 1e-5).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--json", "json_path", default=None, metavar="PATH|-", help="Write the comparison as JSON.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@guarded
def verify_command(original, optimized, dims, int_ranges, inputs_path, rtol, atol, seed, json_path):
    """Run ORIGINAL and OPTIMIZED on the same inputs and compare every output. Exit 0 only when
    they match: 1 when they differ, the optimized model fails, an output is all NaN/inf
    (inconclusive) or the original cannot run (unverifiable)."""
    from fuse_cli.report.render import render_verify_json, render_verify_rich
    from fuse_cli.verify import load_inputs, verify_models

    # the same one-line errors as every command, before onnxruntime sees the files
    header = [load_model(path) for path in (original, optimized)][0].model
    feeds = load_inputs(inputs_path) if inputs_path else None
    result = verify_models(original, optimized, dims=parse_dims(dims), seed=seed, rtol=rtol, atol=atol, feeds=feeds,
                           int_ranges=parse_int_ranges(int_ranges), header=header)
    render_verify_rich(result, _console(stderr=json_path == "-"))
    if json_path == "-":
        click.echo(render_verify_json(result), nl=False)
    elif json_path:
        Path(json_path).write_text(render_verify_json(result), encoding="utf-8")
    sys.exit(0 if result.passed else 1)


@cli.command(name="bench")
@click.argument("model")
@click.argument("optimized", required=False)
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
              help="Bind a symbolic input dimension (repeatable; unbound ones are 1).")
@click.option("--provider", "providers", multiple=True, type=click.Choice(tuple(PROVIDERS)),
              help="Only this provider (repeatable; default: every one a session really gets).")
@click.option("--graph-opt", "levels", multiple=True, type=click.Choice(tuple(GRAPH_OPTIMIZATION)),
              help="onnxruntime graph optimization: disabled (the graph as written), all (its default); default both.")
@click.option("--quick", is_flag=True, help="A few runs only: a smoke test, figures not worth comparing.")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory measurement (a child process per model).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--json", "json_path", default=None, metavar="PATH|-", help="Write the results as JSON.")
@click.option("--markdown", "markdown_path", default=None, metavar="PATH|-", help="Write the results as Markdown.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@guarded
def bench_command(model, optimized, dims, providers, levels, quick, no_memory, seed, json_path, markdown_path):
    """Latency, session-creation time and peak memory of MODEL against OPTIMIZED (default: what fuse
    makes of MODEL, in memory) in onnxruntime, side by side with ratios."""
    from fuse_cli.bench import QUICK, Timing, bench, render_bench_json, render_bench_markdown, render_bench_rich

    config = load_config()
    bound = {**config.dims, **parse_dims(dims)}
    result = bench(model, optimized, config=config.with_overrides(dims=bound), dims=bound,
                   providers=providers or None, levels=levels or tuple(GRAPH_OPTIMIZATION),
                   timing=QUICK if quick else Timing(), measure_memory=not no_memory, seed=seed)
    render_bench_rich(result, _console(stderr="-" in (json_path, markdown_path)))
    for path, text in ((json_path, render_bench_json), (markdown_path, render_bench_markdown)):
        if path == "-":
            click.echo(text(result), nl=False)
        elif path is not None:
            try:
                Path(path).write_text(text(result), encoding="utf-8")
            except OSError as exc:
                raise FuseError(f"{path}: cannot write ({exc.strerror or exc})") from exc


@cli.command(name="passes")
@click.option("--target", type=click.Choice(TARGETS), default="onnx", help="Show the pipeline for this target.")
@click.option("--explain", metavar="PASS", default=None, help="Print what a pass matches and why it is exact.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@guarded
def list_passes(target, explain):
    """List the passes, in pipeline order for a target."""
    console = _console()
    if explain:
        from fuse_cli.pipeline.registry import resolve

        (chosen,) = resolve(target, [explain])
        console.print(f"[bold]{chosen.name}[/bold]: {chosen.description}\n", highlight=False)
        console.print(chosen.explanation, highlight=False, markup=False)
        return
    from rich.table import Table

    default = pipeline_for(target)
    table = Table(title=f"Passes (target {target}; * = in the default pipeline, in run order)", title_justify="left")
    for header in ("Pass", "Default", "Min opset", "Targets", "Description"):
        table.add_column(header)
    ordered = list(default) + sorted(set(REGISTRY) - set(default))
    for name in ordered:
        p = REGISTRY[name]
        table.add_row(name, "*" if name in default else "", str(p.required_opset(target)), ",".join(sorted(p.targets)),
                      p.description)
    console.print(table)
    if target != "onnx":
        from fuse_cli.targets import CAPABILITY_HEADERS, capability_rows

        capabilities = Table(title=f"onnxruntime fused operators and where they run (target {target})",
                             title_justify="left")
        for header in CAPABILITY_HEADERS:
            capabilities.add_column(header, overflow="fold")
        for row in capability_rows(target):
            capabilities.add_row(*row)
        console.print(capabilities)


def main() -> None:
    cli()
