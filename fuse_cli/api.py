"""The library entry point the CLI calls: `optimize` (and, with dry_run, the audit `fuse report`).

The life of a model, each step in its own module:

    load (graph/io) -> shape tables (shape_tables) -> fuse (fusing, passes/)
      -> keep the promises: outputs verified, peak not raised (promises, rollback, verify, audit)
      -> write (graph/output, graph/io) -> the memory audit (audit) -> Report (report/)
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from fuse_cli.audit import PeakEstimate, measure, memory_audit
from fuse_cli.config import FuseConfig
from fuse_cli.core import isolation
from fuse_cli.core.tensors import payload_bytes, weight_bytes
from fuse_cli.fusing import Fused, fuse, what_runtime_target_adds
from fuse_cli.graph.io import load_model, node_count
from fuse_cli.graph.opset import default_opset, upgrade_opset
from fuse_cli.graph.output import CandidateWriter, check_not_over_weights, check_output_path, output_lock
from fuse_cli.graph.weights import ParkingLot, read_in
from fuse_cli.input_domain import binding, free_symbols
from fuse_cli.load_check import loadable
from fuse_cli.passes import resolve
from fuse_cli.pipeline.base import Pass
from fuse_cli.progress import Steps, high_water_mark, step
from fuse_cli.promises import declined_near_miss, keep_promises
from fuse_cli.report.model import Gates, Report
from fuse_cli.report.notes import opset_note, run_level_note, shape_notes
from fuse_cli.shape_tables import build_shape_tables
from fuse_cli.verify import MATCH


@dataclass(frozen=True)
class OptimizeResult:
    report: Report
    # the optimized model, its big weights held by reference to the written files (unwritten: to
    # the input's, and to the caller's lot where one was given): what a caller of a big model
    # should use (graph/weights.py)
    model_by_reference: onnx.ModelProto
    # the external data files the input's weights are in (a written model then has one too)
    input_weight_files: tuple[Path, ...] = ()

    @property
    def model(self) -> onnx.ModelProto:
        """The optimized model whole, its weights read in (on first use)."""
        read_in(self.model_by_reference)
        return self.model_by_reference


def default_output_path(model_path: str | os.PathLike) -> Path:
    path = Path(model_path)
    return path.with_name(f"{path.stem}.fused.onnx")


def optimize(model_path: str | os.PathLike, config: FuseConfig, output_path: str | os.PathLike | None = None,
             *, dry_run: bool = False, in_place: bool = False, steps: Steps | None = None) -> OptimizeResult:
    """Load, fuse, keep the promises, and (unless dry_run) write atomically. Never writes over the
    input unless in_place is set. `steps` records where the time goes (the report's timings) and
    lets a caller watch the run (the command line's status line)."""
    source = Path(model_path)
    target_path = Path(output_path) if output_path is not None else default_output_path(source)
    with (steps or Steps()).recording() as recorder:
        if dry_run:
            result = _optimize(source, config, target_path, dry_run=True)
        else:
            check_output_path(source, target_path, in_place)
            with output_lock(target_path):
                result = _optimize(source, config, target_path, dry_run=False)
        # the worker serves every run of this process: its mark may be an earlier run's
        report = dataclasses.replace(result.report,
                                     timings=recorder.timings(_workers_high_water_mark()))
    return dataclasses.replace(result, report=report)


def _workers_high_water_mark() -> int | None:
    """The largest resident high-water mark of onnxruntime's worker processes (verification's,
    constant folding's), None when none ran."""
    marks = [mark for pid in isolation.worker_pids() if (mark := high_water_mark(pid)) is not None]
    return max(marks, default=None)


def optimize_unwritten(model_path: str | os.PathLike, config: FuseConfig, lot: ParkingLot, *,
                       dry_run: bool = False) -> OptimizeResult:
    """`optimize` writing nothing (the Python API): the model's new weights stay parked in `lot`,
    the caller's to clean up once it is done with the model, which references them there."""
    return _optimize(Path(model_path), config, None, dry_run=dry_run, lot=lot)


def _optimize(source: Path, config: FuseConfig, target_path: Path | None, *, dry_run: bool,
              lot: ParkingLot | None = None) -> OptimizeResult:
    output = None if dry_run else target_path  # None: nothing is written
    with step("load"):
        loaded = load_model(source, freeze_inputs=config.freeze_inputs)
        if output is not None:
            check_not_over_weights(loaded, output, config.external_data)
        opset_before = default_opset(loaded.model)
        if config.upgrade_opset:
            loaded.model = upgrade_opset(loaded.model, config.upgrade_opset)
        # --dim and --input-shape as one binding, which the estimate, verification and --measure share
        config = config.with_overrides(dims=binding(loaded.model, config.dims, config.input_shapes))
        passes = resolve(config.target, config.passes, config.disable)
        resolve(config.target, config.fail_on_near_miss)  # the same "did you mean" for gate pass names
    with step("shape tables"):
        tables = build_shape_tables(loaded.model, config)

    writer = CandidateWriter(loaded, output, config.external_data, lot)
    with step("peak guard"):  # the original's estimated peak, which every candidate's is judged against
        estimate = PeakEstimate(loaded, tables.bound, tables.planner, config)

    def run(selected: list[Pass]) -> Fused:
        return fuse(loaded, selected, tables, config, writer.lot,
                    estimate.estimates(config.schedule_rules))
    try:
        fused, verification, rolled_back, declined = keep_promises(source, loaded, passes, run, estimate, config)
        if verification is None or verification.status != MATCH:  # a `match` was loaded and run
            dropped = {r.pass_name for r in rolled_back} | {d.pass_name for d in declined}
            with step("load check"):
                fused, unloadable = loadable(source, fused, [p for p in passes if p.name not in dropped], run)
            rolled_back += unloadable
        # The audit (a dry run) says what portability costs; `optimize` does not run the pipeline twice.
        runtime_extra = ()
        if config.target == "onnx" and dry_run:
            with step("runtime target"):
                runtime_extra = what_runtime_target_adds(loaded, tables, config)
        # a caller's lot outlives the run: the model keeps referencing the weights parked there
        written = tuple(str(p) for p in writer.settle(fused.model)) if lot is None else ()
    finally:
        if lot is None:
            writer.clean_up()
    optimized = fused.model
    measured = None
    if config.measure:
        with step("measure"):
            measured = measure(source, optimized, tables.bound, config, fused.orders)
    with step("memory audit"):
        memory = memory_audit(estimate, optimized, fused.fusions, tables.bound, fused.orders)
    with step("report"):  # its figures: node counts, weight bytes, notes
        report = Report(
            model_path=str(source),
            output_path=None if output is None else str(output),
            target=config.target,
            passes=tuple(p.name for p in passes),
            fusions=tuple(fused.fusions),
            near_misses=tuple(fused.near_misses) + tuple(declined_near_miss(d) for d in declined),
            nodes_before=node_count(loaded.model.graph),
            nodes_after=node_count(optimized.graph),
            weight_bytes_before=weight_bytes(loaded.model) + sum(payload_bytes(t) or 0
                                                                 for t in loaded.input_defaults.values()),
            weight_bytes_after=weight_bytes(optimized),
            unbound_dims=tables.assumed,
            input_dims=tuple(free_symbols(loaded.model)),
            dims=tuple(sorted(tables.bound.bound_dims.items())),
            written_files=written,
            dry_run=dry_run,
            notes=(shape_notes(tables.bound) + opset_note(opset_before, loaded.model)
                   + run_level_note(config.target, optimized)),
            verification=verification,
            rolled_back=rolled_back,
            runtime_target_would_add=runtime_extra,
            gates=Gates(config.fail_on_fusable, config.max_peak_bytes, config.fail_on_near_miss,
                        config.require_verified),
            measured=measured,
            allow_mismatch=config.allow_mismatch,
            memory=memory,
            peak_guard=declined,
            peak_settings=() if config.allow_peak_growth
            else tuple(tuple(sorted(s.dims.items())) for s in estimate.settings),
            peak_tolerances=() if config.allow_peak_growth else estimate.tolerances(),
            orders=fused.orders,
        )
    return OptimizeResult(report=report, model_by_reference=optimized, input_weight_files=loaded.external_files)
