"""Run onnxruntime where its crash cannot take fuse down: a persistent worker process.

Any runtime may crash on an operator combination (onnxruntime-gpu 1.31.1's CPU com.microsoft
Attention without its bias input segfaults at every shape). Verification, benchmarks and kernel
probes therefore call `call(function, *args)`: the function runs in a child process
(`python -m fuse_cli.core.isolation`) and its result or exception comes back pickled over a pipe.
A child that dies (a signal, an abort) raises RuntimeCrash, a FuseError the caller turns into a
verdict, and the next call starts a fresh child.

The child imports numpy and onnxruntime, not onnx (onnx's import alone takes 1.5-2 s here): what
it loads comes as a core.sessions.Source, the graph's bytes with its big weights left in their
files, which onnxruntime maps there. It is started as soon as fuse knows it will need one
(`start`), so its start-up overlaps the pipeline, and it lives until fuse exits: each call costs
a pickle of the model's graph and of the tensors in and out, not a new interpreter.

One call at a time (a lock): the function may use threads of its own inside the child, as
verification does for a candidate's settings.
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from fuse_cli.errors import FuseError

T = TypeVar("T")


class RuntimeCrash(FuseError):
    """The worker process died while onnxruntime ran in it. str(): "onnxruntime crashed (SIGSEGV)"."""

    def __init__(self, how: str):
        super().__init__(f"onnxruntime crashed ({how})")
        self.how = how


def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """function(*args, **kwargs) in the worker process. `function` must be a module-level
    function of a module that imports without onnx; its exceptions are raised here as they were
    raised there; RuntimeCrash if the process died."""
    return _WORKER.call(function, args, kwargs)


def call_aside(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """As `call`, in a second worker: for the pipeline's own runs (graphsurgeon's constant
    folding), which must neither wait behind verification's runs of the original in the first
    worker (they overlap the pipeline) nor take fuse down when the runtime crashes."""
    return _ASIDE.call(function, args, kwargs)


def start() -> None:
    """Start the worker now (if it is not running), so that its start-up overlaps other work."""
    with _WORKER.lock:
        _WORKER.ensure()


def worker_pids() -> list[int]:
    """The running workers' process ids, for the run's memory cap."""
    return [process.pid for process in (_WORKER.process, _ASIDE.process)
            if process is not None and process.poll() is None]


def crash_description(returncode: int) -> str:
    """"SIGSEGV" for a process a signal killed, else "exit status N"."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


class _Worker:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None

    def ensure(self) -> subprocess.Popen:
        if self.process is None or self.process.poll() is not None:
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
            self.process = subprocess.Popen([sys.executable, "-m", "fuse_cli.core.isolation"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, env=env)
        return self.process

    def call(self, function, args, kwargs):
        with self.lock:
            process = self.ensure()
            try:
                pickle.dump((os.getcwd(), function, args, kwargs), process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
                process.stdin.flush()
                ok, value = pickle.load(process.stdout)
            except (BrokenPipeError, EOFError, pickle.UnpicklingError, ConnectionResetError):
                self.process = None
                _discard(process)
                raise RuntimeCrash(crash_description(process.returncode)) from None
            except BaseException:  # interrupted mid-exchange: its answer would come to the next call
                self.process = None
                process.kill()
                _discard(process)
                raise
        if not ok:
            raise value
        return value

    def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.stdin.close()  # the child's read ends: it exits
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def _discard(process: subprocess.Popen) -> None:
    """Close a dead (or killed) worker's pipes and reap it."""
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:  # unflushed bytes to a process that is gone
            pass
    process.wait()


_WORKER = _Worker()
_ASIDE = _Worker()
atexit.register(_WORKER.close)
atexit.register(_ASIDE.close)


def _serve() -> None:
    """The child: read (the caller's working folder, function, args, kwargs), answer (True,
    result) or (False, exception), until the parent closes the pipe. It works in the caller's
    folder, so a relative path means what it means there. The answers go to a copy of stdout's
    descriptor; stdout itself becomes stderr, so nothing printed can corrupt the stream."""
    # Ctrl-C reaches the whole process group: the parent handles it and ends this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            folder, function, args, kwargs = pickle.load(requests)
        except EOFError:
            return
        try:
            try:
                os.chdir(folder)
            except OSError:
                # the caller's working folder is gone: its shape inference works in a scratch folder
                # for a moment, and a call from another thread (verification's reference runs, beside
                # the pipeline) reads that as the process's; what the worker loads names absolute paths
                pass
            answer = (True, function(*args, **kwargs))
        except Exception as exc:  # the caller decides what it means
            answer = (False, exc)
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an unpicklable result or exception: say so in one that pickles
            data = pickle.dumps((False, FuseError(f"the worker could not return {type(answer[1]).__name__}: {exc}")))
        try:
            answers.write(data)
            answers.flush()
        except BrokenPipeError:  # the parent is gone (it stopped at --max-memory, or was killed)
            return


if __name__ == "__main__":
    _serve()
