"""Verification's runs of a model, as the worker process (core/isolation.py) makes them.

Module-level functions of numpy and onnxruntime only, so the worker imports them without onnx;
verify.py sends them there with the model as a core.sessions.Source and judges what comes back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fuse_cli.core import heap, sessions
from fuse_cli.core.feeds import random_inputs
from fuse_cli.errors import FuseError


def session_for_verification(model, *, optimize: bool = False, providers=("CPUExecutionProvider",),
                             dims: Mapping[str, int] | None = None):
    """A session that runs the graph as written (or at onnxruntime's level all with `optimize`),
    symbolic input dims pinned by `dims` (see core.sessions). Verification runs a model a few
    times and never times it, so memory wins over speed: arena and memory pattern off, so the
    buffers of a run go back to the system with the session (with the arena on, BERT-base kept
    280 MB resident per verification run after its session was gone), no prepacking, so the
    weights stay the mapped file (packed, BERT-base's MatMul weights were 340 MB more), and the
    stored order, so a weight's float32 copy for an fp16 MatMul lives only until that MatMul.
    Its threads do not spin: the original's runs go on beside the pipeline (promises.py)."""
    return sessions.make_session(model, level="all" if optimize else "disabled", providers=providers, dims=dims,
                                 lean_memory=True, prepack=False, stored_order=True, spin=False)


def reference_run(source: sessions.Source, dims: Mapping[str, int], *, seed: int = 0,
                  int_ranges: Mapping[str, tuple[int, int] | None] | None = None,
                  feeds: Mapping[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The original at one setting: (its inputs, seeded unless `feeds` are given; its outputs)."""
    try:
        session = session_for_verification(source, dims=dims)
        inputs = dict(feeds) if feeds else random_inputs(session, dims=dims, seed=seed, int_ranges=int_ranges)
        return inputs, sessions.run(session, inputs)
    finally:
        session = None
        heap.trim()


def runtime_envelope(source: sessions.Source, dims: Mapping[str, int], feeds: Mapping[str, np.ndarray],
                     expected: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, float]:
    """How far onnxruntime's own optimizations (its default level, all) move each output in `names`
    from `expected` (the original as written) on the same `feeds`: the largest difference over
    the elements finite in both."""
    optimized, failure = _candidate_run(source, dims, feeds, optimize=True)
    if failure is not None:
        raise failure
    envelope = {}
    for name in names:
        want, got = np.asarray(expected[name], np.float64), np.asarray(optimized[name], np.float64)
        finite = np.isfinite(want) & np.isfinite(got)
        envelope[name] = float(np.abs(want[finite] - got[finite]).max()) if finite.any() else 0.0
    return envelope


def candidate_runs(source: sessions.Source, settings: Sequence[tuple[Mapping[str, int], Mapping[str, np.ndarray]]],
                   concurrent: bool) -> list[tuple[dict[str, np.ndarray] | None, FuseError | None]]:
    """The candidate at each (dims, feeds): its outputs, or why it failed to load or run.
    `concurrent`: the settings' sessions are built and run at once, on threads (onnxruntime
    releases the GIL while it builds and runs a session): the time of one on two cores, the
    memory of two sessions. Else one at a time, and none after a failure."""
    if concurrent and len(settings) > 1:
        with ThreadPoolExecutor(len(settings)) as pool:
            return list(pool.map(lambda setting: _candidate_run(source, *setting), settings))
    outcomes = []
    for setting in settings:
        outcomes.append(_candidate_run(source, *setting))
        if outcomes[-1][1] is not None:
            break
    return outcomes


def _candidate_run(source: sessions.Source, dims: Mapping[str, int], feeds: Mapping[str, np.ndarray],
                   optimize: bool = False) -> tuple[dict[str, np.ndarray] | None, FuseError | None]:
    try:
        session = session_for_verification(source, optimize=optimize, dims=dims)
        wanted = {i.name for i in session.get_inputs()}
        return sessions.run(session, {k: v for k, v in feeds.items() if k in wanted}), None
    except FuseError as exc:
        return None, exc
    finally:
        session = None
        heap.trim()


def load(source: sessions.Source) -> None:
    """Build a session of the model as written, and drop it: raises FuseError if onnxruntime
    cannot load it (load_check.py: no output that does not load)."""
    session = session_for_verification(source)
    del session
    heap.trim()


def run_constants(model_bytes: bytes, names: Sequence[str]) -> list[np.ndarray]:
    """The outputs `names` of an input-free model (graphsurgeon's constant subgraph to fold)."""
    import onnxruntime

    # graphsurgeon builds these at onnxruntime's default log level, whose optimizer warnings on a
    # constant subgraph ("UnsqueezeElimination cannot remove node") are noise here
    onnxruntime.set_default_logger_severity(3)
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(list(names), {})


def saved_as_run(model_bytes: bytes) -> bytes:
    """The graph onnxruntime's CPU provider runs `model_bytes` as, at ORT_DISABLE_ALL, as its
    session saves it (optimized_model_filepath): functions inlined, Casts inserted."""
    import os
    import tempfile

    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = os.path.join(folder, "saved.onnx")
        onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        with open(options.optimized_model_filepath, "rb") as saved:
            return saved.read()
