"""The library entry points the CLI calls: `optimize` and `report` (a dry run)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from fuse_cli import __version__
from fuse_cli.analysis.shapes import ShapeTable, TensorInfo, element_size_bits, infer_shapes
from fuse_cli.config import FuseConfig
from fuse_cli.errors import FuseError, UsageError
from fuse_cli.graph.edit import GraphEditor, toposort
from fuse_cli.graph.io import LoadedModel, assemble_model, load_model, save_model
from fuse_cli.passes import resolve
from fuse_cli.passes.engine import run_pipeline
from fuse_cli.report.model import Report


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
    passes = resolve(config.target, config.passes, config.disable)
    symbolic = infer_shapes(loaded.model)
    bound = _bound_shapes(loaded.model, config)
    sizes = _SizeAccountant(bound)

    graph = gs.import_onnx(loaded.model)
    editor = GraphEditor(
        graph,
        opset=_default_opset(loaded.model),
        shapes={name: info.shape for name, info in symbolic.tensors.items()},
        dtypes={name: info.elem_type for name, info in symbolic.tensors.items()},
        input_defaults=loaded.input_defaults,
        fold_limit_bytes=config.fold_limit_bytes,
    )
    fusions, near_misses = run_pipeline(editor, passes, sizes)
    graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
    toposort(graph)
    exported = gs.export_onnx(graph, do_type_check=False)
    provenance = f"fuse {__version__} --target {config.target} passes: {','.join(p.name for p in passes)}"
    optimized = assemble_model(loaded, exported.graph, provenance)

    written: tuple[str, ...] = ()
    if not dry_run:
        written = tuple(str(p) for p in save_model(optimized, target_path, external_data=config.external_data))
    report = Report(
        model_path=str(source),
        output_path=None if dry_run else str(target_path),
        target=config.target,
        passes=tuple(p.name for p in passes),
        fusions=tuple(fusions),
        near_misses=tuple(near_misses),
        nodes_before=_node_count(loaded),
        nodes_after=len(optimized.graph.node),
        weight_bytes_before=_weight_bytes(loaded.model) + sum(_tensor_bytes(t) for t in loaded.input_defaults.values()),
        weight_bytes_after=_weight_bytes(optimized),
        unbound_dims=tuple(sorted(sizes.unbound)),
        dims=tuple(sorted(config.dims.items())),
        written_files=written,
        dry_run=dry_run,
    )
    return OptimizeResult(report=report, model=optimized)


def _check_output_path(source: Path, target: Path, in_place: bool) -> None:
    if target.exists() and target.is_dir():
        raise UsageError(f"{target}: output path is a directory")
    same = target.exists() and source.exists() and os.path.samefile(source, target)
    if (same or target.resolve() == source.resolve()) and not in_place:
        raise UsageError(f"{target}: output would overwrite the input; pass --in-place to allow it")


def _bound_shapes(model: onnx.ModelProto, config: FuseConfig) -> ShapeTable:
    try:
        return infer_shapes(model, config.dims, config.input_shapes)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


class _SizeAccountant:
    """Bytes of a tensor at the bound shapes. A symbolic dim nobody bound counts as 1 and its name
    is remembered so the report can say so; a dim that is unknown makes the size unknown."""

    def __init__(self, table: ShapeTable):
        self._table = table
        self.unbound: set[str] = set()

    def __call__(self, name: str) -> int | None:
        info = self._table.get(name)
        return None if info is None else self.size(info)

    def size(self, info: TensorInfo) -> int | None:
        bits = element_size_bits(info.elem_type)
        if bits is None or info.shape is None or any(d is None for d in info.shape):
            return None
        count = 1
        for dim in info.shape:
            if isinstance(dim, str):
                self.unbound.add(dim)
            else:
                count *= dim
        return (count * bits + 7) // 8


def _default_opset(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    raise FuseError("model imports no default-domain (ai.onnx) opset")


def _node_count(loaded: LoadedModel) -> int:
    return len(loaded.model.graph.node)


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
