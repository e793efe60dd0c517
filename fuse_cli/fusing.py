"""One run of a pipeline on a fresh import of the loaded model: passes, cleanup, export."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
import time
from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from fuse_cli import __version__
from fuse_cli.shape_tables import ShapeTables
from fuse_cli.config import FuseConfig
from fuse_cli.core import heap
from fuse_cli.graph.edit import GraphEditor, model_names, subgraphs, toposort, unique_name
from fuse_cli.graph.io import LoadedModel, assemble_model, load_graph, unload_unchanged_weights
from fuse_cli.graph.weights import ParkingLot, mapped_weights_alive
from fuse_cli.graph.opset import default_opset, ensure_domain_imports
from fuse_cli.passes import resolve
from fuse_cli.pipeline.base import Estimates, ModelPass, Pass
from fuse_cli.pipeline.engine import run_pipeline
from fuse_cli.pipeline.records import FusionRecord, NearMiss, OrderRecord
from fuse_cli.progress import pass_ran, step, update


@dataclass(frozen=True)
class Fused:
    model: onnx.ModelProto
    fusions: list[FusionRecord]
    near_misses: list[NearMiss]
    orders: tuple[OrderRecord, ...] = ()


def fuse(loaded: LoadedModel, passes: list[Pass], tables: ShapeTables, config: FuseConfig,
         lot: ParkingLot, estimates: Estimates | None = None) -> Fused:
    """One run of the pipeline on a fresh import of the loaded model: the graph passes to their
    fixpoint, cleanup, export, then the model passes once each (they need the memory model's
    `estimates`; without them they do not run). tables (shape_tables.py, built once per run):
    `proofs` and `inside` the shapes checks may rely on, in the main graph and in bodies;
    `bound` the sizes removed intermediates are counted at. The new big weights the
    passes computed are parked in `lot`: the model holds them by reference."""
    with step("pipeline"):
        return _fuse(loaded, passes, tables, config, lot, estimates)


def _fuse(loaded: LoadedModel, passes: list[Pass], tables: ShapeTables, config: FuseConfig,
          lot: ParkingLot, estimates: Estimates | None) -> Fused:
    model_passes = [p for p in passes if isinstance(p, ModelPass)]
    passes_on_graph = [p for p in passes if not isinstance(p, ModelPass)]
    # onnx-graphsurgeon's logger print()s its warnings: keep stdout for results (`--json -`).
    with contextlib.redirect_stdout(sys.stderr), step("passes"):
        graph, fusions, near_misses = _run_passes(loaded, passes_on_graph, tables, config, lot)
    with step("export"):
        with contextlib.redirect_stdout(sys.stderr):
            graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
            toposort(graph)
            unload_unchanged_weights(graph)
            lot.park_constants(graph)
            exported = gs.export_onnx(graph, do_type_check=False)
        # graphsurgeon's nodes and tensors refer to each other: only a collection frees the graph, and
        # with it the mapped weights the passes read (a Conv+BN stack: its whole size, until the next
        # automatic collection, which could come after onnxruntime has mapped the candidate's too).
        # It takes 0.5 s on a 12k-node graph: only when there are such weights.
        del graph
        if mapped_weights_alive():
            gc.collect()
        heap.trim()
        provenance = f"fuse {__version__} --target {config.target} passes: {','.join(p.name for p in passes)}"
        model = assemble_model(loaded, exported, provenance)
        ensure_domain_imports(model)
    orders: list[OrderRecord] = []
    with step("model passes"):
        for model_pass in model_passes if estimates is not None else ():
            update(model_pass.name)
            started = time.perf_counter()
            record = model_pass.run(model, estimates)
            pass_ran(model_pass.name, time.perf_counter() - started)
            if isinstance(record, OrderRecord):
                orders.append(record)
            else:
                fusions.extend(record)
    return Fused(model, fusions, near_misses, tuple(orders))


def _run_passes(loaded: LoadedModel, passes: list[Pass], tables: ShapeTables, config: FuseConfig,
                lot: ParkingLot | None = None
                ) -> tuple[gs.Graph, list[FusionRecord], list[NearMiss]]:
    """The passes to their fixpoint on the main graph, then inside every If branch and Loop/Scan
    body (outermost first), then on the main graph again where a body changed: a body that stops
    reading an outer tensor can free the outer fusion that tensor's reader blocked."""
    graph = load_graph(loaded)
    # Sorted once up front (iteratively): every replacement then stands where its root stood, so
    # the order stays topological without re-sorting per match.
    toposort(graph)
    names = model_names(graph)  # one set for every scope: a new name is new in the whole model
    shapes = {name: shape for name, (_, shape) in tables.inside.items()}
    shapes.update((name, info.shape) for name, info in tables.proofs.tensors.items())
    dtypes = {name: elem_type for name, (elem_type, _) in tables.inside.items()}
    dtypes.update((name, info.elem_type) for name, info in tables.proofs.tensors.items())

    def editor(scope: gs.Graph) -> GraphEditor:
        enclosed = scope is not graph
        return GraphEditor(
            scope,
            opset=default_opset(loaded.model),
            shapes=shapes,
            dtypes=dtypes,
            input_defaults=loaded.input_defaults,
            fold_limit_bytes=config.fold_limit_bytes,
            target=config.target,
            # a body's new weights stay in memory: the parking lot's references live in the main
            # graph's initializers, which the writers and onnxruntime's loader read from files
            lot=None if enclosed else lot,
            names=names,
            enclosed=enclosed,
        )
    fusions, near_misses = run_pipeline(editor(graph), passes, tables.bound.nbytes)
    in_bodies, body_misses = _run_in_bodies(graph, editor, passes, tables.bound.nbytes, names)
    if in_bodies:
        more, near_misses = run_pipeline(editor(graph), passes, tables.bound.nbytes)
        fusions += more
    return graph, fusions + in_bodies, near_misses + body_misses


def _run_in_bodies(graph: gs.Graph, editor, passes: list[Pass], size_of, names: set[str]
                   ) -> tuple[list[FusionRecord], list[NearMiss]]:
    fusions: list[FusionRecord] = []
    near_misses: list[NearMiss] = []
    for node in list(graph.nodes):
        for body in subgraphs(node):
            # graphsurgeon's folder exports a body as a model of its own: at the model's IR version
            # and opsets, not onnx's newest defaults, which onnxruntime refuses (IR 14)
            body.ir_version, body.opset = graph.ir_version, graph.opset
            body.import_domains = body.import_domains or graph.import_domains
            returned = [t.name for t in body.outputs]
            made, missed = run_pipeline(editor(body), passes, size_of)
            _returns_its_own(body, returned, names)
            nested, nested_missed = _run_in_bodies(body, editor, passes, size_of, names)
            fusions += made + nested
            near_misses += missed + nested_missed
    return fusions, near_misses


def _returns_its_own(body: gs.Graph, old_names: list[str], taken: set[str]) -> None:
    """A body returns values it computes (onnxruntime refuses a branch output that is an outer
    value, or a weight): where a rewrite left an output read straight from the enclosing graph
    (graphsurgeon's folder drops an Identity of an outer tensor), an Identity computes it again,
    under the output's old name while no tensor of the body holds it, else a new name (`taken`:
    the model's names, shared by every scope)."""
    inside = {id(n) for n in body.nodes}
    own_inputs = {id(t) for t in body.inputs}
    in_use = set(body.tensors())
    for i, tensor in enumerate(body.outputs):
        if id(tensor) in own_inputs or (tensor.inputs and id(tensor.inputs[0]) in inside):
            continue
        old = old_names[i] if i < len(old_names) else tensor.name
        name = old if old not in in_use else unique_name(old, taken)
        value = gs.Variable(name, dtype=tensor.dtype, shape=tensor.shape)
        body.nodes.append(gs.Node("Identity", name=unique_name(f"{name}_returned", taken), inputs=[tensor],
                                  outputs=[value]))
        body.outputs[i] = value
        in_use.add(name)


RUNTIME_TARGET = "ort"


def what_runtime_target_adds(loaded: LoadedModel, tables: ShapeTables,
                             config: FuseConfig) -> tuple[tuple[str, int], ...]:
    """The cost of portability: fusions only an onnxruntime target would make, by pattern. Only
    the fusion records are needed, so the graph is never exported."""
    portable = set(resolve("onnx", None, config.disable))
    runtime = [p for p in resolve(RUNTIME_TARGET, None, config.disable) if not isinstance(p, ModelPass)]
    extra = {p.name for p in runtime if p not in portable}
    if not extra:
        return ()
    with contextlib.redirect_stdout(sys.stderr):
        _, fusions, _ = _run_passes(loaded, runtime, tables, dataclasses.replace(config, target=RUNTIME_TARGET))
    counts: dict[str, int] = {}
    for record in fusions:
        if record.pass_name in extra:
            counts[record.pattern] = counts.get(record.pattern, 0) + 1
    return tuple(counts.items())

