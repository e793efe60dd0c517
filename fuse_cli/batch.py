"""Optimize many models in parallel processes; one failure never stops the others.

Workers return plain JSON-ready records (the report as `render.to_json_dict` writes it), so
nothing unpicklable crosses the process boundary and `--json` can print one record per model.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuse_cli.config import FuseConfig
from fuse_cli.core.memory_cap import default_cap_bytes
from fuse_cli.errors import EXIT_CHECK_FAILED, EXIT_OK, EXIT_USAGE, FuseError, UsageError


@dataclass(frozen=True)
class BatchItem:
    model: str
    output: str
    exit_code: int
    report: dict[str, Any] | None  # the JSON report, when the run got that far
    error: str | None

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def expand_models(paths: Iterable[str]) -> list[Path]:
    """Files as given; a folder stands for the .onnx files directly inside it (sorted)."""
    models: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.onnx") if p.is_file() and not p.name.endswith(".fused.onnx"))
            if not found:
                raise UsageError(f"{path}: is a directory with no .onnx files in it")
            models += found
        else:
            models.append(path)
    return models


def output_for(model: Path, out_dir: Path | None) -> Path:
    name = f"{model.stem}.fused.onnx"
    return (out_dir / name) if out_dir is not None else model.with_name(name)


def optimize_many(models: list[Path], config: FuseConfig, out_dir: Path | None, jobs: int,
                  on_done: Callable[[BatchItem], None] = lambda item: None, dry_run: bool = False) -> list[BatchItem]:
    """Results in the order the models were given, whatever order they finish in. A dry run
    (`fuse report` on several models) writes nothing."""
    if out_dir is not None and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: --out-dir folder does not exist")
    outputs = [output_for(m, out_dir) for m in models]
    if len(set(outputs)) != len(outputs):
        raise UsageError("two models would be written to the same output name; give them distinct file names")
    jobs = max(1, min(jobs, len(models)))
    # each worker's share of the run's memory cap (core/memory_cap.py)
    cap = (config.max_memory_bytes or default_cap_bytes()) // jobs
    results: dict[int, BatchItem] = {}
    for i, item in _in_workers(list(enumerate(zip(models, outputs))), config, dry_run, jobs, cap):
        results[i] = item
        on_done(item)
    return [results[i] for i in range(len(models))]


def _in_workers(work: list[tuple[int, tuple[Path, Path]]], config: FuseConfig, dry_run: bool, jobs: int,
                cap: int) -> Iterator[tuple[int, BatchItem]]:
    """One process per model, `jobs` at a time: a worker that dies (the OOM killer's SIGKILL, a
    crash inside onnxruntime) costs its own model only, which is reported with the signal.
    spawn, not fork: a forked child inherits onnxruntime's thread pools mid-state and can hang."""
    context = multiprocessing.get_context("spawn")
    running: dict[int, tuple[Any, Any, Path, Path]] = {}
    try:
        while work or running:
            while work and len(running) < jobs:
                i, (model, output) = work.pop(0)
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(target=_worker, args=(writer, str(model), str(output), config, dry_run, cap),
                                          daemon=True)
                process.start()
                writer.close()  # the child holds its end: EOF here when it dies
                running[i] = (process, reader, model, output)
            ready = set(wait([obj for process, reader, *_ in running.values() for obj in (reader, process.sentinel)]))
            for i, (process, reader, model, output) in list(running.items()):
                if reader not in ready and process.sentinel not in ready:
                    continue
                item = _receive(reader)
                process.join()
                reader.close()
                del running[i]
                yield i, item if item is not None else _dead(str(model), str(output), process.exitcode)
    finally:
        for process, reader, *_ in running.values():
            process.kill()
            process.join()


def _receive(reader) -> BatchItem | None:
    try:
        return reader.recv() if reader.poll() else None
    except (EOFError, OSError):
        return None


def _dead(model: str, output: str, exitcode: int | None) -> BatchItem:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        why = f"its worker process was killed by {name}" + (" (out of memory?)" if -exitcode == signal.SIGKILL else "")
        code = 128 - exitcode  # as a shell reports a killed command
    else:
        why, code = f"its worker process exited with {exitcode} before reporting", EXIT_CHECK_FAILED
    return BatchItem(model, output, code, None, why)


def _worker(connection, model: str, output: str, config: FuseConfig, dry_run: bool, cap: int) -> None:
    from fuse_cli.core.memory_cap import watch_memory

    try:
        watch_memory(cap)
        connection.send(_optimize_one(model, output, config, dry_run))
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches every process of the group: the parent reports it, once
    finally:
        connection.close()


def _optimize_one(model: str, output: str, config: FuseConfig, dry_run: bool) -> BatchItem:
    # Imported here so a worker process pays for onnx/onnxruntime once, and so this module stays
    # importable without them for --help.
    from fuse_cli import api
    from fuse_cli.report.render import to_json_dict

    try:
        report = api.optimize(model, config, output, dry_run=dry_run).report
        return BatchItem(model, "" if dry_run else output, report.exit_code, to_json_dict(report), None)
    except FuseError as exc:
        return BatchItem(model, output, exc.exit_code, None, str(exc))
    except Exception as exc:  # noqa: BLE001 - one broken model must not stop the batch
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return BatchItem(model, output, EXIT_USAGE + 1, None, f"internal error ({type(exc).__name__}: {first})")


def batch_exit_code(items: list[BatchItem]) -> int:
    return EXIT_OK if all(item.ok for item in items) else EXIT_CHECK_FAILED


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))
