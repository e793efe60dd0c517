"""The one onnxruntime session factory, and running a session.

fuse runs onnxruntime for three reasons, each with its own settings: verification (the graph as
written, its symbolic dims pinned), benchmarks (one thread, a chosen provider and optimization
level) and memory measurement (arena and memory pattern off too). One factory makes them all, so
a setting that matters (the quiet log, pinned dims) is never missing from one of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from fuse_cli.errors import FuseError

# onnxruntime's GraphOptimizationLevel by the names fuse's options use
LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}
# onnxruntime's log severity for fuse's sessions and runs: fatal only. Its errors come back as
# exceptions, which fuse turns into one line of its own; printed, they would show twice, in red.
QUIET = 4


def make_session(model: onnx.ModelProto | str | os.PathLike | bytes, *, level: str = "disabled",
                 providers: Sequence[str] = ("CPUExecutionProvider",), dims: Mapping[str, int] | None = None,
                 threads: int | None = None, lean_memory: bool = False):
    """An onnxruntime session. level "disabled" runs the graph as written (a comparison then
    tests fuse's rewrite, not onnxruntime's own fusions). `dims` pins symbolic input dims by
    name: session creation is quadratic in the node count while inputs have free dims (a 12k-node
    stack: 40 s, pinned 0.5 s). `lean_memory`: arena and memory pattern off, so freed buffers go
    back to the system (what a peak measurement needs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    for name, value in (dims or {}).items():
        options.add_free_dimension_override_by_name(name, int(value))
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    if lean_memory:
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
    options.log_severity_level = QUIET
    ort.set_default_logger_severity(QUIET)
    if isinstance(model, onnx.ModelProto):
        source = model.SerializeToString()
    else:
        source = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(source, options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own exception types
        raise FuseError(f"onnxruntime cannot load it: {first_line(exc)}") from exc


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
