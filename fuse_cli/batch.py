"""Optimize many models in parallel processes; one failure never stops the others.

Workers return plain JSON-ready records (the report as `render.to_json_dict` writes it), so
nothing unpicklable crosses the process boundary and `--json` can print one record per model.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuse_cli.config import FuseConfig
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
    results: dict[int, BatchItem] = {}
    if jobs == 1:
        for i, (model, output) in enumerate(zip(models, outputs)):
            results[i] = _optimize_one(str(model), str(output), config, dry_run)
            on_done(results[i])
    else:
        # spawn, not fork: a forked child inherits onnxruntime's thread pools mid-state and can hang
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_optimize_one, str(m), str(o), config, dry_run): i
                       for i, (m, o) in enumerate(zip(models, outputs))}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                on_done(results[futures[future]])
    return [results[i] for i in range(len(models))]


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
