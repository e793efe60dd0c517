"""The one onnxruntime session factory, and running a session.

fuse runs onnxruntime for three reasons, each with its own settings: verification (the graph as
written, its symbolic dims pinned), benchmarks (one thread, a chosen provider and optimization
level) and memory measurement (arena and memory pattern off too). One factory makes them all, so
a setting that matters (the quiet log, pinned dims) is never missing from one of them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fuse_cli.errors import FuseError

# onnxruntime's GraphOptimizationLevel by the names fuse's options use
LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
# onnxruntime's log severity for fuse's sessions and runs: fatal only. Its errors come back as
# exceptions, which fuse turns into one line of its own; printed, they would show twice, in red.
QUIET = 4


@dataclass(frozen=True)
class Source:
    """What onnxruntime loads: a path, or a model's bytes with the folder its weights held by
    reference are read from. Picklable and small (no weights in it), so it travels to the
    process that runs sessions (core/isolation.py)."""

    model: str | bytes
    external_folder: str | None = None


def source_of(model) -> Source:
    """A Source for an onnx.ModelProto (weights held by reference stay in their files), a path or
    bytes. onnx is imported only for a ModelProto: the worker process never needs it."""
    if isinstance(model, Source):
        return model
    if isinstance(model, bytes):
        return Source(model)
    if isinstance(model, (str, os.PathLike)):
        return Source(str(model))
    with _SERIALIZING:
        return _serialized_by_reference(model)


def make_session(model, *, level: str = "disabled",
                 providers: Sequence[str] = ("CPUExecutionProvider",), dims: Mapping[str, int] | None = None,
                 threads: int | None = None, lean_memory: bool = False, prepack: bool = True,
                 stored_order: bool = False, spin: bool = True):
    """An onnxruntime session. level "disabled" runs the graph as written (a comparison then
    tests fuse's rewrite, not onnxruntime's own fusions). `dims` pins symbolic input dims by
    name: session creation is quadratic in the node count while inputs have free dims (a 12k-node
    stack: 40 s, pinned 0.5 s). `lean_memory`: arena and memory pattern off, so freed buffers go
    back to the system (what a peak measurement needs). `prepack` False: kernels read constant
    weights where they are (a mapped file) instead of a packed copy, which for MatMul weights is
    the model's size again. `stored_order`: nodes run in Kahn's order, ties in stored order
    (PRIORITY_BASED), not onnxruntime's default reverse depth-first order, which runs every node
    that reads only weights first: the Casts its CPU provider inserts before fp16 MatMuls then
    hold a float32 copy of every weight at once (a 1.9 GB fp16 decoder: 3.4 GB peak, 2.0 GB in
    stored order). `spin` False: its pool's threads sleep between tasks instead of spinning, so
    they leave the cores to work that goes on beside the session."""
    import onnxruntime as ort

    source = source_of(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    for name, value in (dims or {}).items():
        options.add_free_dimension_override_by_name(name, int(value))
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if lean_memory:
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if stored_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.log_severity_level = QUIET
    ort.set_default_logger_severity(QUIET)
    if source.external_folder is not None:
        options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, source.external_folder)
    try:
        return ort.InferenceSession(source.model, options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own exception types
        raise FuseError(f"onnxruntime cannot load it: {first_line(exc)}") from exc


# onnxruntime's session option: the folder external data is read from, for a model given as bytes
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
# _serialized_by_reference rewrites a model's weight locations while it serializes it: one model,
# one thread at a time (the original's reference runs go on beside the pipeline)
_SERIALIZING = threading.Lock()


def _serialized_by_reference(model) -> Source:
    """The model's bytes for onnxruntime. Weights fuse holds by reference (absolute locations,
    graph/weights.py) stay in their files: onnxruntime maps external data files instead of
    copying them (BERT-base: 35 MB resident after session creation, against 450 MB for the same
    weights embedded or handed over as OrtValues, which it copies), and only the small graph
    travels to the worker process. It accepts only locations inside one folder, symlinks
    resolved: each location is written relative to the deepest folder that holds all the files."""
    import onnx

    referenced = [t for t in model.graph.initializer
                  if t.data_location == onnx.TensorProto.EXTERNAL
                  and os.path.isabs(_location(t))]
    if not referenced:
        return Source(model.SerializeToString())
    files = {_location(t): os.path.realpath(_location(t)) for t in referenced}
    root = os.path.commonpath([os.path.dirname(f) for f in files.values()])
    originals = [_location(t) for t in referenced]
    try:
        for tensor, location in zip(referenced, originals):
            _set_location(tensor, os.path.relpath(files[location], root))
        return Source(model.SerializeToString(), root)
    finally:
        for tensor, location in zip(referenced, originals):
            _set_location(tensor, location)


def _location(tensor) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _set_location(tensor, location: str) -> None:
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def run(session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    names = [o.name for o in session.get_outputs()]
    options = ort.RunOptions()
    options.log_severity_level = QUIET
    try:
        values = session.run(names, dict(feeds), options)
    except Exception as exc:
        raise FuseError(f"onnxruntime failed to run it: {first_line(exc)}") from exc
    return dict(zip(names, values))


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
