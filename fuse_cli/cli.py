"""The `fuse` command line: parse, call the library, render, exit. Nothing else lives here; what
the commands share (options, config, output, the error guard) is in cli_options.py.

stdout carries results (the table, or JSON/Markdown when written to `-`); errors go to stderr as
one line. Exit codes (errors.py): 0 ok, 1 a check failed, 2 bad input or usage, 3 an internal error.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click
from rich.console import Console

from fuse_cli import __version__, api
from fuse_cli.bench import GRAPH_OPTIMIZATION, PROVIDERS
from fuse_cli.cli_options import (check_report_paths, check_writable, config_from_options, console, debug_option,
                                  dim_option, emit, fusion_options, guarded, int_range_option, json_option,
                                  markdown_option, progress_options, seed_option)
from fuse_cli.config import load_config, parse_dims
from fuse_cli.core.memory_cap import watch_memory
from fuse_cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from fuse_cli.graph.io import load_model
from fuse_cli.passes import TARGETS
from fuse_cli.report.html import write_html
from fuse_cli.report.plot import write_plot
from fuse_cli.progress import Steps
from fuse_cli.report.render import render_json, render_markdown, render_rich, render_timings
from fuse_cli.report.status_line import watching
from fuse_cli.verify import parse_int_ranges


def _emit_report(report, json_path, markdown_path, plot_path, html_path, show_timings: bool, steps: Steps) -> None:
    """The report's outputs; showing the table (a big model's near-misses take a while) is a step
    of the run too, so the JSON written after it has its time."""
    def show(report, console) -> None:
        with steps.step("show the report"):
            render_rich(report, console)
            if show_timings:
                render_timings(report.timings, console)

    def to_json(report) -> str:
        return render_json(dataclasses.replace(report, timings=steps.timings(report.timings.worker_peak_rss_bytes)))
    emit(report, show, texts=((json_path, to_json), (markdown_path, render_markdown)),
         files=((plot_path, write_plot), (html_path, write_html)))


def _optimize_one(model, config, quiet: bool, verbose: bool, steps: Steps, **kwargs) -> api.OptimizeResult:
    """api.optimize, watched on stderr (report/status_line.py)."""
    with watching(steps, console(stderr=True), quiet=quiet, verbose=verbose):
        return api.optimize(model, config, steps=steps, **kwargs)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fuse")
def cli() -> None:
    """fuse: fuse ONNX operators and audit activation memory."""


@cli.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL... | DIR")
@click.option("-o", "--output", default=None, metavar="PATH",
              help="Where to write (default: <stem>.fused.onnx beside MODEL).")
@click.option("--out-dir", default=None, metavar="DIR", help="Batch: write each <stem>.fused.onnx into DIR.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Batch: parallel processes (default: up to 4).")
@click.option("--in-place", is_flag=True, help="Allow writing over MODEL.")
@click.option("--external-data/--embed-data", default=None,
              help="Store weights in a side .data file, or in the .onnx file (default: where the input has them).")
@fusion_options
@progress_options
@guarded
def optimize(models, output, out_dir, jobs, in_place, external_data, json_path, markdown_path, plot_path, html_path,
             show_timings, quiet, verbose, **options):
    """Fuse MODEL and write the optimized model; several models or a folder run as a batch."""
    steps = Steps()
    with steps.step("options"):
        check_writable(json_path, markdown_path, plot_path, html_path)
        check_report_paths((json_path, markdown_path, plot_path, html_path), _models_touched(models, output, out_dir))
        config = config_from_options(**options).with_overrides(external_data=external_data)
        watch_memory(config.max_memory_bytes)
    if len(models) == 1 and not Path(models[0]).is_dir() and out_dir is None:
        report = _optimize_one(models[0], config, quiet, verbose, steps, output_path=output, in_place=in_place).report
        _emit_report(report, json_path, markdown_path, plot_path, html_path, show_timings, steps)
        sys.exit(report.exit_code)
    if output or in_place or markdown_path or plot_path or html_path or show_timings:
        raise UsageError("-o, --in-place, --markdown, --plot, --html and --timings take one model; "
                         "use --out-dir for a batch")
    sys.exit(_run_batch(models, config, out_dir, jobs, json_path, quiet=quiet))


@cli.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL... | DIR")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Several models: parallel processes.")
@fusion_options
@progress_options
@guarded
def report(models, jobs, json_path, markdown_path, plot_path, html_path, show_timings, quiet, verbose, **options):
    """Memory audit and dry run: what fusion would do to MODEL, without writing the model."""
    steps = Steps()
    with steps.step("options"):
        check_writable(json_path, markdown_path, plot_path, html_path)
        check_report_paths((json_path, markdown_path, plot_path, html_path), _models_touched(models, writes=False))
        config = config_from_options(**options)
        watch_memory(config.max_memory_bytes)
    if len(models) == 1 and not Path(models[0]).is_dir():
        result = _optimize_one(models[0], config, quiet, verbose, steps, dry_run=True).report
        _emit_report(result, json_path, markdown_path, plot_path, html_path, show_timings, steps)
        sys.exit(result.exit_code)
    if markdown_path or plot_path or html_path or show_timings:
        raise UsageError("--markdown, --plot, --html and --timings take one model")
    sys.exit(_run_batch(models, config, None, jobs, json_path, dry_run=True, quiet=quiet))


def _models_touched(models, output: str | None = None, out_dir: str | None = None, *,
                    writes: bool = True) -> list[Path]:
    """The models a run reads and, for optimize, writes: what no report may overwrite."""
    from fuse_cli.batch import expand_models, output_for

    inputs = expand_models(models)
    if not writes:
        return inputs
    if output is not None:
        return [*inputs, Path(output)]
    return [*inputs, *(output_for(m, Path(out_dir) if out_dir else None) for m in inputs)]


def _run_batch(models, config, out_dir, jobs, json_path, dry_run: bool = False, quiet: bool = False) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fuse_cli.batch import batch_exit_code, default_jobs, expand_models, optimize_many
    from fuse_cli.report.render import render_batch_json, render_batch_rich

    paths = expand_models(models)
    progress = Progress(TextColumn("[bold]fuse[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=False, disable=quiet)
    with progress:
        task = progress.add_task("auditing" if dry_run else "optimizing", total=len(paths))
        items = optimize_many(paths, config, Path(out_dir) if out_dir else None, jobs or default_jobs(),
                              on_done=lambda item: progress.advance(task), dry_run=dry_run)
    emit(items, render_batch_rich, texts=((json_path, render_batch_json),))
    return batch_exit_code(items)


@cli.command(name="verify")
@click.argument("original")
@click.argument("optimized")
@dim_option(help="Value for a symbolic dimension (default: distinct primes, at two settings).")
@int_range_option(help="Range for an integer input's random values, high exclusive (default: what the graph implies).")
@click.option("--inputs", "inputs_path", default=None, metavar="FILE.npz|DIR",
              help="Real inputs: a .npz file, or a folder of onnx TensorProto .pb files named after the inputs.")
@click.option("--rtol", type=click.FloatRange(min=0), default=None,
              help="Relative tolerance (default by dtype: fp32 1e-4).")
@click.option("--atol", type=click.FloatRange(min=0), default=None,
              help="Absolute tolerance (default by dtype: fp32 1e-5).")
@seed_option
@json_option(help="Write the comparison as JSON.")
@debug_option
@guarded
def verify_command(original, optimized, dims, int_ranges, inputs_path, rtol, atol, seed, json_path):
    """Run ORIGINAL and OPTIMIZED on the same inputs and compare every output. Exit 0 only when
    they match: 1 when they differ, the optimized model fails, an output is all NaN/inf
    (inconclusive) or the original cannot run (unverifiable)."""
    from fuse_cli.report.render import render_verify_json, render_verify_rich
    from fuse_cli.verify import load_inputs, verify_models

    # the same one-line errors as every command, before onnxruntime sees the files
    check_writable(json_path)
    check_report_paths((json_path,), (original, optimized))
    watch_memory(None)  # the default cap: 75% of RAM
    header = [load_model(path) for path in (original, optimized)][0].model
    feeds = load_inputs(inputs_path) if inputs_path else None
    result = verify_models(original, optimized, dims=parse_dims(dims), seed=seed, rtol=rtol, atol=atol, feeds=feeds,
                           int_ranges=parse_int_ranges(int_ranges), header=header)
    emit(result, render_verify_rich, texts=((json_path, render_verify_json),))
    sys.exit(EXIT_OK if result.passed else EXIT_CHECK_FAILED)


@cli.command(name="bench")
@click.argument("model")
@click.argument("optimized", required=False)
@dim_option(help="Bind a symbolic input dimension (repeatable; unbound ones are 1).")
@click.option("--provider", "providers", multiple=True, type=click.Choice(tuple(PROVIDERS)),
              help="Only this provider (repeatable; default: every one a session really gets).")
@click.option("--graph-opt", "levels", multiple=True, type=click.Choice(tuple(GRAPH_OPTIMIZATION)),
              help="onnxruntime graph optimization: disabled (the graph as written), all (its default); default both.")
@click.option("--quick", is_flag=True, help="A few runs only: a smoke test, figures not worth comparing.")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory measurement (a child process per model).")
@seed_option
@json_option(help="Write the results as JSON.")
@markdown_option(help="Write the results as Markdown.")
@debug_option
@guarded
def bench_command(model, optimized, dims, providers, levels, quick, no_memory, seed, json_path, markdown_path):
    """Latency, session-creation time and peak memory of MODEL against OPTIMIZED (default: what fuse
    makes of MODEL, in memory) in onnxruntime, side by side with ratios."""
    from fuse_cli.bench import QUICK, Timing, bench
    from fuse_cli.report.bench import render_bench_json, render_bench_markdown, render_bench_rich

    check_writable(json_path, markdown_path)
    check_report_paths((json_path, markdown_path), (model, optimized))
    watch_memory(None)  # the default cap: 75% of RAM
    config = load_config()
    bound = {**config.dims, **parse_dims(dims)}
    result = bench(model, optimized, config=config.with_overrides(dims=bound), dims=bound,
                   providers=providers or None, levels=levels or tuple(GRAPH_OPTIMIZATION),
                   timing=QUICK if quick else Timing(), measure_memory=not no_memory, seed=seed)
    emit(result, render_bench_rich, texts=((json_path, render_bench_json), (markdown_path, render_bench_markdown)))


@cli.command(name="passes")
@click.option("--target", type=click.Choice(TARGETS), default=None,
              help="Show the pipeline for this target (default: onnx; with --markdown, every target).")
@click.option("--explain", metavar="PASS", default=None, help="Print what a pass matches and why it is exact.")
@markdown_option(is_flag=False, flag_value="-",
                 help="Write the passes reference as Markdown (to stdout without PATH); docs/passes.md is this.")
@debug_option
@guarded
def list_passes(target, explain, markdown_path):
    """List the passes, in pipeline order for a target."""
    from fuse_cli.cli_options import write_output
    from fuse_cli.pipeline.registry import resolve
    from fuse_cli.report.passes import render_explanation, render_passes, render_passes_markdown

    if explain and markdown_path:
        raise UsageError("--explain prints one pass and --markdown the whole reference: give one of them")
    check_writable(markdown_path)
    if markdown_path:
        write_output(markdown_path, render_passes_markdown(target))
    elif explain:
        (chosen,) = resolve(target or "onnx", [explain])
        render_explanation(chosen, console())
    else:
        render_passes(target or "onnx", console())


def main() -> None:
    cli()
