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
from fuse_cli.analysis.measure import measure_peak
from fuse_cli.analysis.memory import profile_memory
from fuse_cli.analysis.shapes import ShapeTable, element_size_bits, infer_shapes, with_runtime_dims
from fuse_cli.config import FuseConfig
from fuse_cli.errors import FuseError, UsageError
from fuse_cli.graph.edit import GraphEditor, toposort
from fuse_cli.graph.io import (LoadedModel, assemble_model, has_unread_weights, load_graph,
                               load_model, save_model, unload_unchanged_weights)
from fuse_cli.graph.opset import default_opset, ensure_domain_imports, upgrade_opset
from fuse_cli.passes import resolve
from fuse_cli.passes.engine import run_pipeline
from fuse_cli.passes.base import Pass
from fuse_cli.report.model import FusionRecord, Gates, MeasuredPeaks, MemoryAudit, NearMiss, Report, RolledBack
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

    fused = fuse(passes)
    verification: VerifyResult | None = None
    rolled_back: tuple[RolledBack, ...] = ()
    writer = _Writer(loaded, None if dry_run else target_path, config.external_data)
    try:
        if config.verify:
            fused, verification, rolled_back = _verify_and_roll_back(source, loaded, passes, fused, fuse, config, writer)
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
        near_misses=tuple(near_misses),
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
        measured=_measure(source, optimized, bound) if config.measure else None,
        allow_mismatch=config.allow_mismatch,
        memory=_memory_audit(loaded, bound, symbolic, optimized, config, fusions),
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


def _verify_and_roll_back(source: Path, loaded: LoadedModel, passes: list[Pass], fused: _Fused, fuse,
                          config: FuseConfig, writer: _Writer):
    """Compare with the original in onnxruntime. On a mismatch (an output differs, or the
    candidate fails where the original runs), bisect the pipeline for the first pass whose
    rewrites break it, drop it, and try again until nothing is broken. The original runs once per
    shape setting, whatever the number of candidates."""
    reference = reference_for(str(source), loaded.model, config.dims, int_ranges=config.int_ranges)

    def check(candidate: _Fused) -> VerifyResult:
        # From a file, not the bytes of the model: onnxruntime parses either way, and bytes would
        # be one more copy of every weight (BERT-base: 2.9 -> 2.3 GB peak RSS for fuse optimize).
        return compare_with_reference(reference, writer.for_verification(candidate.model), config.rtol, config.atol)

    result = check(fused)
    active = list(passes)
    rolled_back: list[RolledBack] = []
    while result.status == MISMATCH and active:
        good, bad = 0, len(active)  # a prefix of `good` passes is not broken, one of `bad` is
        while bad - good > 1:
            middle = (good + bad) // 2
            if check(fuse(active[:middle])).status != MISMATCH:
                good = middle
            else:
                bad = middle
        rolled_back.append(_rolled_back(active.pop(bad - 1).name, result))
        fused = fuse(active)
        result = check(fused)
    return fused, result, tuple(rolled_back)


def _rolled_back(pass_name: str, result: VerifyResult) -> RolledBack:
    if not result.failing():  # the candidate did not run: nothing to compare
        return RolledBack(pass_name, None, None, result.reason)
    worst = max(result.failing(), key=lambda o: o.max_abs_diff)
    return RolledBack(pass_name, worst.name, worst.max_abs_diff, worst.problem)


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


def _memory_audit(loaded: LoadedModel, bound: ShapeTable, symbolic: ShapeTable, optimized: onnx.ModelProto,
                  config: FuseConfig, fusions: list[FusionRecord]) -> MemoryAudit:
    defaults = tuple(loaded.input_defaults)
    before = profile_memory(loaded.model, bound, extra_weights=defaults, symbolic_shapes=symbolic)
    # The bindings in effect are known (bound.bound_dims): one inference, not _bound_shapes' two.
    try:
        after_bound = infer_shapes(optimized, bound.bound_dims, config.input_shapes, symbolic=True)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    # onnxruntime infers its contrib operators' outputs (MultiHeadAttention, ...) at run time, and its
    # planner compares those shapes: fill what onnx cannot infer from its symbolic inference. Only
    # then: on a 12k-node graph that inference takes longer than the whole pipeline.
    after_symbolic = infer_shapes(optimized, symbolic=_has_contrib_nodes(optimized))
    # onnx cannot infer contrib operators (FusedConv, ...), but a fused node writes the tensor
    # its pattern's root wrote, under the same name: the original's shapes still hold for it.
    after = profile_memory(optimized, _fill_from(after_bound, bound), extra_weights=defaults,
                           symbolic_shapes=_fill_from(after_symbolic, symbolic))
    removed_by_pattern: dict[tuple[str, str], set[str]] = {}
    for record in fusions:
        removed_by_pattern.setdefault((record.pass_name, record.pattern), set()).update(t.name for t in record.removed)
    deltas = tuple(
        (pass_name, pattern,
         profile_memory(loaded.model, bound, extra_weights=defaults, absent=names,
                        symbolic_shapes=symbolic).peak_bytes - before.peak_bytes)
        for (pass_name, pattern), names in removed_by_pattern.items()
    )
    unknown = tuple(f"{u.tensor}[{u.dim if u.dim is not None else '?'}]" for u in bound.unknown_dims)
    return MemoryAudit(before=before, after=after, peak_delta_by_pattern=deltas, unknown_dims=unknown)


def _measure(source: Path, optimized: onnx.ModelProto, bound: ShapeTable) -> MeasuredPeaks:
    """The truth the estimate is checked against: both models run in onnxruntime, each in a
    child process, at the same bound shapes the estimate used."""
    try:
        return MeasuredPeaks(before=measure_peak(source, dims=bound.bound_dims),
                             after=measure_peak(optimized, dims=bound.bound_dims))
    except ValueError as exc:
        raise UsageError(f"--measure: {exc}") from exc


def _unknowns(info) -> int:
    """How much of a tensor's type is unknown: its dtype, its rank, or single dims."""
    if info.elem_type == 0 or info.shape is None:
        return 1_000
    return sum(1 for d in info.shape if d is None)


def _has_contrib_nodes(model: onnx.ModelProto) -> bool:
    return any(node.domain not in ("", "ai.onnx") for node in model.graph.node)


def _fill_from(table: ShapeTable, fallback: ShapeTable) -> ShapeTable:
    """`table` with the tensors it could not size taken from `fallback` (same names)."""
    missing = {name for name, info in table.tensors.items() if _unknowns(info) > 0}
    if not missing:
        return table
    merged = dict(table.tensors)
    for name in missing:
        info = fallback.get(name)
        if info is not None and _unknowns(info) < _unknowns(merged[name]):
            merged[name] = info
    filled = {name for name in missing if name in fallback.tensors}
    return dataclasses.replace(table, tensors=merged,
                               unknown_dims=tuple(u for u in table.unknown_dims if u.tensor not in filled))


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
