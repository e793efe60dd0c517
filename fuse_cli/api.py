"""The library entry points the CLI calls: `optimize` and `report` (a dry run)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from fuse_cli import __version__
from fuse_cli.analysis.shapes import ShapeTable, element_size_bits, infer_shapes, with_runtime_dims
from fuse_cli.audit import PeakEstimate, measure, memory_audit
from fuse_cli.config import FuseConfig
from fuse_cli.errors import FuseError, UsageError
from fuse_cli.graph.edit import GraphEditor, toposort
from fuse_cli.graph.io import (LoadedModel, assemble_model, has_unread_weights, load_graph,
                               load_model, save_model, unload_unchanged_weights)
from fuse_cli.graph.opset import default_opset, ensure_domain_imports, upgrade_opset
from fuse_cli.passes import resolve
from fuse_cli.pipeline.engine import run_pipeline
from fuse_cli.pipeline.base import Pass
from fuse_cli.report.model import FusionRecord, Gates, NearMiss, PeakDecline, Report, RolledBack
from fuse_cli.report.render import human_bytes
from fuse_cli.rollback import drop_breaking_passes
from fuse_cli.verify import MISMATCH, VerifyResult, compare_with_reference, reference_for


@dataclass(frozen=True)
class OptimizeResult:
    report: Report
    model: onnx.ModelProto


def default_output_path(model_path: str | os.PathLike) -> Path:
    path = Path(model_path)
    return path.with_name(f"{path.stem}.fused.onnx")


def optimize(model_path: str | os.PathLike, config: FuseConfig, output_path: str | os.PathLike | None = None,
             *, dry_run: bool = False, in_place: bool = False) -> OptimizeResult:
    """Load, fuse, and (unless dry_run) write atomically. Never writes over the input unless
    in_place is set."""
    source = Path(model_path)
    target_path = Path(output_path) if output_path is not None else default_output_path(source)
    if not dry_run:
        _check_output_path(source, target_path, in_place)
    loaded = load_model(source, freeze_inputs=config.freeze_inputs)
    if not dry_run:
        _check_not_over_weights(loaded, target_path, config.external_data)
    opset_before = default_opset(loaded.model)
    if config.upgrade_opset:
        loaded.model = upgrade_opset(loaded.model, config.upgrade_opset)
    passes = resolve(config.target, config.passes, config.disable)
    resolve(config.target, config.fail_on_near_miss)  # the same "did you mean" for gate pass names
    symbolic = infer_shapes(loaded.model)  # as onnxruntime's planner sees shapes: for the memory model
    checkable = with_runtime_dims(loaded.model, symbolic, proofs=True)  # what fusion preconditions may rely on
    bound, unbound = _bound_shapes(loaded.model, config, unbound_table=symbolic)

    def fuse(selected: list[Pass]) -> _Fused:
        return _fuse(loaded, selected, checkable, bound, config)

    estimate = PeakEstimate(loaded, bound, symbolic, config)
    writer = _Writer(loaded, None if dry_run else target_path, config.external_data)
    try:
        fused, verification, rolled_back, declined = _keep_promises(source, loaded, passes, fuse, estimate, config,
                                                                    writer)
        optimized, fusions, near_misses = fused.model, fused.fusions, fused.near_misses
        # The audit (a dry run) says what portability costs; `optimize` does not run the pipeline twice.
        runtime_extra = (_what_runtime_target_adds(loaded, checkable, bound, config)
                         if config.target == "onnx" and dry_run else ())

        written: tuple[str, ...] = ()
        if not dry_run:
            written = tuple(str(p) for p in writer.final(optimized))
    finally:
        writer.clean_up()
    report = Report(
        model_path=str(source),
        output_path=None if dry_run else str(target_path),
        target=config.target,
        passes=tuple(p.name for p in passes),
        fusions=tuple(fusions),
        near_misses=tuple(near_misses) + tuple(_declined_near_miss(d) for d in declined),
        nodes_before=len(loaded.model.graph.node),
        nodes_after=len(optimized.graph.node),
        weight_bytes_before=_weight_bytes(loaded.model) + sum(_tensor_bytes(t) for t in loaded.input_defaults.values()),
        weight_bytes_after=_weight_bytes(optimized),
        unbound_dims=unbound,
        dims=tuple(sorted(bound.bound_dims.items())),
        written_files=written,
        dry_run=dry_run,
        notes=_notes(bound) + _opset_note(opset_before, loaded.model) + _run_level_note(config.target, optimized),
        verification=verification,
        rolled_back=rolled_back,
        runtime_target_would_add=runtime_extra,
        gates=Gates(config.fail_on_fusable, config.max_peak_bytes, config.fail_on_near_miss, config.require_verified),
        measured=measure(source, optimized, bound, config) if config.measure else None,
        allow_mismatch=config.allow_mismatch,
        memory=memory_audit(estimate, optimized, fusions, bound),
        peak_guard=declined,
        peak_settings=() if config.allow_peak_growth else tuple(tuple(sorted(s.dims.items())) for s in estimate.settings),
    )
    return OptimizeResult(report=report, model=optimized)


@dataclass(frozen=True)
class _Fused:
    model: onnx.ModelProto
    fusions: list[FusionRecord]
    near_misses: list[NearMiss]


def _fuse(loaded: LoadedModel, passes: list[Pass], symbolic: ShapeTable, bound: ShapeTable,
          config: FuseConfig) -> _Fused:
    """One run of the pipeline on a fresh import of the loaded model."""
    # onnx-graphsurgeon's logger print()s its warnings: keep stdout for results (`--json -`).
    with contextlib.redirect_stdout(sys.stderr):
        graph, fusions, near_misses = _run_passes(loaded, passes, symbolic, bound, config)
        graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
        toposort(graph)
        if has_unread_weights(loaded.model):
            unload_unchanged_weights(graph)
        exported = gs.export_onnx(graph, do_type_check=False)
    del graph
    provenance = f"fuse {__version__} --target {config.target} passes: {','.join(p.name for p in passes)}"
    model = assemble_model(loaded, exported, provenance)
    ensure_domain_imports(model)
    return _Fused(model, fusions, near_misses)


def _run_passes(loaded: LoadedModel, passes: list[Pass], symbolic: ShapeTable, bound: ShapeTable,
                config: FuseConfig) -> tuple[gs.Graph, list[FusionRecord], list[NearMiss]]:
    graph = load_graph(loaded)
    # Sorted once up front (iteratively): every replacement then stands where its root stood, so
    # the order stays topological without re-sorting per match.
    toposort(graph)
    editor = GraphEditor(
        graph,
        opset=default_opset(loaded.model),
        shapes={name: info.shape for name, info in symbolic.tensors.items()},
        dtypes={name: info.elem_type for name, info in symbolic.tensors.items()},
        input_defaults=loaded.input_defaults,
        fold_limit_bytes=config.fold_limit_bytes,
        target=config.target,
    )
    fusions, near_misses = run_pipeline(editor, passes, bound.nbytes)
    return graph, fusions, near_misses


class _Writer:
    """Writes candidates for verification when they cannot go to onnxruntime from memory (weights
    still in the input's external data, or over protobuf's 2 GB): to the output path itself, so
    the final save of a verified model is not done twice and no third copy takes disk space; in a
    dry run or when writing over the input (which verification reads), to a temporary folder."""

    def __init__(self, loaded: LoadedModel, target: Path | None, external_data: bool | None):
        self.loaded, self.target, self.external_data = loaded, target, external_data
        self._to_target = target is not None and not _same_file(loaded.path, target)
        self._scratch: Path | None = None
        self._at_target: tuple[onnx.ModelProto, list[Path]] | None = None

    def for_verification(self, model: onnx.ModelProto) -> Path:
        if self._to_target:
            return self.final(model)[0]
        self._scratch = self._scratch or Path(tempfile.mkdtemp(prefix="fuse-verify-"))
        return save_model(model, self._scratch / "candidate.onnx", source_dir=self.loaded.path.parent)[0]

    def final(self, model: onnx.ModelProto) -> list[Path]:
        assert self.target is not None
        if self._at_target is None or self._at_target[0] is not model:
            self._at_target = (model, save_model(model, self.target, external_data=self.external_data,
                                                 source_dir=self.loaded.path.parent))
        return self._at_target[1]

    def clean_up(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _keep_promises(source: Path, loaded: LoadedModel, passes: list[Pass], fuse, estimate: PeakEstimate,
                   config: FuseConfig, writer: _Writer):
    """The pipeline less the passes that break fuse's promises: the outputs are the original's
    (verification; a candidate that fails where the original runs breaks it too) and the
    estimated peak is not above the original's (the peak guard, unless --allow-peak-growth).
    Each broken promise drops passes by bisection (rollback.py); a pass dropped for one promise
    changes the candidate the other judged, so the two alternate until neither drops one."""
    reference = (reference_for(str(source), loaded.model, config.dims, int_ranges=config.int_ranges)
                 if config.verify else None)

    def peak_judge(candidate: _Fused):
        growth = () if config.allow_peak_growth else estimate.growth(candidate.model)
        return not growth, growth

    def verify_judge(candidate: _Fused):
        # From a file, not the bytes of the model: onnxruntime parses either way, and bytes would
        # be one more copy of every weight (BERT-base: 2.9 -> 2.3 GB peak RSS for fuse optimize).
        result = compare_with_reference(reference, writer.for_verification(candidate.model), config.rtol, config.atol)
        return result.status != MISMATCH, result

    active, fused = list(passes), fuse(passes)
    verification, rolled_back, declined = None, [], []
    while True:
        guarded = drop_breaking_passes(active, fused, fuse, peak_judge)
        declined += [PeakDecline(p.name, getattr(p, "label", p.name), growth) for p, growth in guarded.dropped]
        if reference is None or (verification is not None and not guarded.dropped):
            return guarded.candidate, verification, tuple(rolled_back), tuple(declined)
        checked = drop_breaking_passes(guarded.active, guarded.candidate, fuse, verify_judge)
        rolled_back += [_rolled_back(p.name, result) for p, result in checked.dropped]
        active, fused, verification = checked.active, checked.candidate, checked.evidence
        if not checked.dropped:
            return fused, verification, tuple(rolled_back), tuple(declined)


def _rolled_back(pass_name: str, result: VerifyResult) -> RolledBack:
    if not result.failing():  # the candidate did not run: nothing to compare
        return RolledBack(pass_name, None, None, result.reason)
    worst = max(result.failing(), key=lambda o: o.max_abs_diff)
    return RolledBack(pass_name, worst.name, worst.max_abs_diff, worst.problem)


def _declined_near_miss(decline: PeakDecline) -> NearMiss:
    worst = max(decline.growth, key=lambda g: g.after_bytes - g.before_bytes)
    dims = ", ".join(f"{k}={v}" for k, v in worst.dims) or "the model's static shapes"
    alive = ", ".join(repr(name) for name in worst.alive)
    return NearMiss(decline.pass_name, decline.pattern, (), (
        f"raises the estimated peak activation memory by {human_bytes(worst.after_bytes - worst.before_bytes)} "
        f"({human_bytes(worst.before_bytes)} -> {human_bytes(worst.after_bytes)}) at {dims}: the new peak is at "
        f"{worst.peak_node}, where {alive} are alive; pass --allow-peak-growth to keep it"))


RUNTIME_TARGET = "ort"


def _what_runtime_target_adds(loaded: LoadedModel, symbolic: ShapeTable, bound: ShapeTable,
                              config: FuseConfig) -> tuple[tuple[str, int], ...]:
    """The cost of portability: fusions only an onnxruntime target would make, by pattern. Only
    the fusion records are needed, so the graph is never exported."""
    portable = set(resolve("onnx", None, config.disable))
    runtime = resolve(RUNTIME_TARGET, None, config.disable)
    extra = {p.name for p in runtime if p not in portable}
    if not extra:
        return ()
    with contextlib.redirect_stdout(sys.stderr):
        _, fusions, _ = _run_passes(loaded, runtime, symbolic, bound, dataclasses.replace(config, target=RUNTIME_TARGET))
    counts: dict[str, int] = {}
    for record in fusions:
        if record.pass_name in extra:
            counts[record.pattern] = counts.get(record.pattern, 0) + 1
    return tuple(counts.items())


def _check_output_path(source: Path, target: Path, in_place: bool) -> None:
    """Before any work: the output must be writable and must not clobber the input."""
    if target.exists() and target.is_dir():
        raise UsageError(f"{target}: output path is a directory")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{target}: output folder {folder} does not exist")
    if _same_file(source, target) and not in_place:
        raise UsageError(f"{target}: output would overwrite the input; pass --in-place to allow it")


def _check_not_over_weights(loaded: LoadedModel, target: Path, external_data: bool | None) -> None:
    """Writing over the file the input's weights live in would corrupt the input (--in-place
    included: the model file is replaced atomically, its weights file is not)."""
    for weights in loaded.external_files:
        for written in (target, target.with_name(target.name + ".data")):
            if _same_file(weights, written) and (written == target or external_data is not False):
                raise UsageError(f"{written}: output would overwrite the input's external data file")


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _bound_shapes(model: onnx.ModelProto, config: FuseConfig, assumed: tuple[str, ...] | None = None, *,
                  unbound_table: ShapeTable | None = None) -> tuple[ShapeTable, tuple[str, ...]]:
    """Shapes at the user's bindings. Symbolic dims nobody bound are taken as 1 (and returned, so
    the report says so); binding happens before inference because data propagation through
    Shape/Reshape arithmetic only yields sizes for values known up front.

    unbound_table: the model's inference without bindings, when the caller has it; with no dims
    and no input shapes given it is the first table, and is not computed again. Each inference
    of a deep model takes longer than loading it."""
    try:
        if unbound_table is not None and not config.dims and not config.input_shapes:
            table = unbound_table
        else:
            table = infer_shapes(model, config.dims, config.input_shapes, symbolic=True)
        if assumed is None:
            assumed = tuple(sorted({u.symbol for u in table.unknown_dims if u.symbol} - set(table.bound_dims)))
        if assumed:
            table = infer_shapes(model, {**{name: 1 for name in assumed}, **table.bound_dims}, config.input_shapes,
                                 symbolic=True)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return table, assumed


def _opset_note(before: int, model: onnx.ModelProto) -> tuple[str, ...]:
    after = default_opset(model)
    return (f"converted from opset {before} to {after} (IR version {model.ir_version})",) if after != before else ()


def _notes(table: ShapeTable) -> tuple[str, ...]:
    notes = [f"--dim {name} matches no dimension of this model" for name in table.unused_dims]
    return tuple(notes + list(table.warnings))


def _run_level_note(target: str, model: onnx.ModelProto) -> tuple[str, ...]:
    """onnxruntime's own optimizer (on by default, level all) fuses Add + LayerNormalization into
    SkipLayerNormalization wherever it knows both Add inputs' shapes, which the contrib
    operators' shape inference gives it. Its CPU kernel is slow in onnxruntime 1.31 (6.6x the
    unfused pair, see targets.py): the transformer sample then runs 1.41x slower at level all,
    0.87x at disabled. Runs of an offline-optimized model need no online optimizer."""
    if target != "ort-cpu":
        return ()
    adds = {out for node in model.graph.node if node.op_type == "Add" for out in node.output}
    if not any(node.op_type == "LayerNormalization" and node.input and node.input[0] in adds for node in model.graph.node):
        return ()
    return ("run this model in onnxruntime with graph optimizations at basic or disabled: at the default level "
            "(all) onnxruntime 1.31 fuses Add + LayerNormalization into its slow CPU SkipLayerNormalization "
            "(measured 1.4x slower on a transformer block)",)


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    bits = element_size_bits(tensor.data_type) or 0
    count = 1
    for dim in tensor.dims:
        count *= dim
    return (count * bits + 7) // 8


def _weight_bytes(model: onnx.ModelProto) -> int:
    """Initializers plus Constant nodes' values: what the model carries, not what it computes."""
    total = sum(_tensor_bytes(t) for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    total += _tensor_bytes(attr.t)
    return total
