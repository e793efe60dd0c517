"""graphsurgeon's constant folder, its onnxruntime sessions run in a worker process.

graphsurgeon imports onnxruntime inside its folder and builds an InferenceSession for each
constant subgraph; a runtime that crashes on one would take fuse down. For the length of a fold
(`sessions_in_the_worker`), sessions the folding thread builds are stand-ins whose runs go to
isolation's second worker (`call_aside`): a crash there is an exception graphsurgeon's error_ok
turns into a subgraph left unfolded, and the crashes are counted for the caller.
"""

from __future__ import annotations

import contextlib
import threading

import onnxruntime

from fuse_cli.core import isolation
from fuse_cli.core.model_runs import run_constants
from fuse_cli.errors import FuseError


class WorkerSession:
    """What graphsurgeon's folder needs of an InferenceSession (`run(names, {})` on an input-free
    model), run in a worker process: a runtime that crashes on a constant subgraph is a subgraph
    left unfolded (graphsurgeon's error_ok), not fuse's death."""

    def __init__(self, model_bytes: bytes, crashes: list[str]):
        self.model_bytes, self.crashes = model_bytes, crashes

    def run(self, names, feeds):
        if feeds:  # graphsurgeon's folder feeds nothing; anything else is not ours to route
            raise FuseError("a folding session was given inputs")
        try:
            return isolation.call_aside(run_constants, self.model_bytes, names)
        except isolation.RuntimeCrash as crash:
            self.crashes.append(crash.how)
            raise


@contextlib.contextmanager
def sessions_in_the_worker():
    """graphsurgeon imports onnxruntime inside its folder and builds sessions there: for the length
    of the fold, sessions this thread builds go to the worker; other threads (verification's
    reference runs, beside the pipeline) keep onnxruntime's own class. Yields the crashes seen."""
    real, folding, crashes = onnxruntime.InferenceSession, threading.get_ident(), []

    def session(model, *args, **kwargs):
        if threading.get_ident() == folding and isinstance(model, bytes):
            return WorkerSession(model, crashes)
        return real(model, *args, **kwargs)

    onnxruntime.InferenceSession = session
    try:
        yield crashes
    finally:
        onnxruntime.InferenceSession = real
