"""Measure a model's real peak activation memory in onnxruntime, to check the liveness estimate.

A fresh child process (`python -m fuse_cli.analysis.measure`, so nothing the caller holds is
counted) builds the session the estimate models (`fuse_cli.analysis.memory`): CPU, graph
optimizations disabled, memory arena and memory pattern off, one intra-op and one inter-op thread
(no thread-pool stacks, one im2col tile). It makes seeded inputs, runs once to warm up, then per
repeat reads VmRSS, writes "5" to /proc/self/clear_refs (which resets VmHWM to the current RSS),
copies the inputs, runs once and reads VmHWM. The figure is the smallest VmHWM - VmRSS.

Counted as the estimate counts: the inputs are copied after the baseline, so they weigh like the
estimate's graph inputs (live for the whole run); the outputs come back as numpy arrays over
onnxruntime's own buffers (measured: no copy) and are still held when VmHWM is read, like the
estimate's graph outputs.

glibc: a freed block normally stays in glibc's heap and the next run reuses it without the
kernel noticing, so RSS hardly moves (the transformer sample measured 0 bytes). The child pins
glibc's mmap threshold at 16 KiB (MALLOC_MMAP_THRESHOLD_, which also stops glibc from raising it
as large blocks are freed): every buffer of 16 KiB or more is its own mapping and goes back to the
kernel when freed, so RSS follows what onnxruntime holds. At 64 KiB the many small tensors of a
batch-1 vision model came from heap pages the warm-up had left resident and went uncounted: the
measured peak was 15-25% low and moved between runs (mobilevit-xxs 6.05 and 6.81 MiB, estimate
7.53; at 16 KiB 7.43 and 7.50). Below 16 KiB a mapping's page rounding starts to count (a 4 KiB
tensor takes two pages). numpy's huge-page advice is off, so a 4 MiB array is not counted as
2 MiB pages. What is left is noise of tens of pages: the kernel's RSS counters are per-CPU
approximations, and blocks under 16 KiB come from glibc's heap.

Where this cannot work (no /proc/self/clear_refs, a write refused, a C library that is not glibc)
the result says why, with no figure: never a guess.

A second, exact figure where memray is installed (the `measure` extra): one more run under
memray's allocation tracker, whose high-water mark is the most bytes onnxruntime held from the C
allocator at once (malloc, posix_memalign, operator new: memray patches every loaded library's
calls to them) -- requested bytes, no pages, no per-CPU counters. A Conv -> BatchNormalization
graph whose buffers are 1.675 MiB reads 1.676 MiB allocated and 1.17-1.28 MiB resident. Below a
few MiB the resident figure is the noisier one (see FACTS.md); above, the two agree within a few
percent. The allocated figure counts no freed page that stayed resident and no page touched by a
tensor's first write only, so it is what the liveness estimate models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import onnx

from fuse_cli.core.isolation import crash_description
from fuse_cli.errors import FuseError
from fuse_cli.input_domain import binding, branch_selecting_values, input_dim_keys, input_shapes_at

CLEAR_REFS = "/proc/self/clear_refs"
STATUS = "/proc/self/status"
_MMAP_THRESHOLD = 16 * 1024
_CHILD_TIMEOUT_S = 600
# After the reset VmHWM must sit at VmRSS; a kernel that ignores the write leaves the process's
# lifetime maximum there. The counters are approximate, so allow some pages of slack.
_RESET_SLACK_BYTES = 1024 * 1024
_NO_BINDINGS: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Measurement:
    peak_bytes: int | None      # activation peak: VmHWM during one run minus RSS before it; None when not measurable
    method: str                 # one sentence on how it was measured (goes into JSON `measured.method`)
    baseline_bytes: int | None  # RSS after warm-up
    reason: str | None          # why not measurable, when peak_bytes is None
    # the exact allocator high-water mark during one run (memray); None without memray, with the reason
    allocated_bytes: int | None = None
    allocated_reason: str | None = None

    @property
    def exact_or_resident_bytes(self) -> int | None:
        """The allocator's exact count where memray measured it, else the resident figure."""
        return self.allocated_bytes if self.allocated_bytes is not None else self.peak_bytes


def method_sentence(repeats: int) -> str:
    return (
        f"Smallest of {repeats} onnxruntime CPU runs (graph optimizations, memory arena and memory "
        "pattern off, one thread) of VmHWM minus VmRSS, reset through /proc/self/clear_refs after "
        "a warm-up, in a child process with glibc's mmap threshold at 16 KiB; inputs copied "
        "after the baseline and outputs held, as the estimate counts them; where memray is "
        "installed, also the allocator's high-water mark during one more run (allocated bytes)."
    )


def measure_peak(model: onnx.ModelProto | str | Path, *, dims: Mapping[str, int] = _NO_BINDINGS,
                 input_shapes: Mapping[str, Sequence[int]] = _NO_BINDINGS, seed: int = 0,
                 repeats: int = 3, int_ranges: Mapping[str, tuple[int, int]] = _NO_BINDINGS,
                 stored_order: bool = False) -> Measurement:
    """Run `model` in a child process and measure its peak activation memory (see the module
    docstring). Integer inputs take values from `int_ranges[name]` (low inclusive, high
    exclusive) where given, else the constant an If's condition compares them with
    (branch_selecting_values), else core.feeds.random_inputs' default range. `stored_order`: nodes run
    as stored (onnxruntime's PRIORITY_BASED order, what runtimes that follow the file do) instead of
    its default reverse depth-first walk. A ModelProto is written to
    a temporary file, so its weights must be in it or in files it names by absolute path (fuse's
    references, graph/weights.py); a path is loaded by the child as it is. Raises ValueError when
    an input dim is neither fixed nor bound by `dims` or `input_shapes`, and FuseError when onnxruntime
    cannot load or run the model."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    shapes = concrete_input_shapes(proto, dims, input_shapes)
    int_ranges = {**{name: (value, value + 1) for name, value in branch_selecting_values(proto).items()}, **int_ranges}
    request = {"shapes": shapes, "seed": seed, "repeats": repeats, "stored_order": stored_order,
               "int_ranges": {name: list(bounds) for name, bounds in int_ranges.items()}}
    with tempfile.TemporaryDirectory(prefix="fuse-measure-") as tmp:
        if isinstance(model, onnx.ModelProto):
            path = Path(tmp) / "model.onnx"
            path.write_bytes(model.SerializeToString())
            # weights fuse holds by reference (absolute locations): the session factory resolves them
            request["by_reference"] = True
        else:
            path = Path(model)
        request["model"] = str(path)
        reply = _run_child(request)
    if "error" in reply:
        raise FuseError(reply["error"])
    return Measurement(reply["peak_bytes"], method_sentence(repeats), reply["baseline_bytes"], reply["reason"],
                       reply.get("allocated_bytes"), reply.get("allocated_reason"))


def concrete_input_shapes(model: onnx.ModelProto, dims: Mapping[str, int],
                          input_shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """The shape each fed input gets, at the one binding (input_domain.binding) of `dims` and
    `input_shapes`: a dim without a usable name ('?', -1, none) by its position key, so `-1` takes
    the batch given. An input dim left open is a ValueError, not a silent 2 or 1."""
    shapes = input_shapes_at(model, binding(model, dims, input_shapes))
    shapes.update({name: [int(d) for d in shape] for name, shape in input_shapes.items()})
    keys = input_dim_keys(model)
    missing = [f"{name}[{index}]" + (f" ({keys[(name, index)]})" if (name, index) in keys else "")
               for name, shape in shapes.items() for index, d in enumerate(shape) if d is None]
    if missing:
        raise ValueError("cannot measure with unbound input dims: " + ", ".join(missing)
                         + "; bind them with dims or input_shapes")
    return shapes


def _run_child(request: dict) -> dict:
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["MALLOC_MMAP_THRESHOLD_"] = str(_MMAP_THRESHOLD)
    env["NUMPY_MADVISE_HUGEPAGE"] = "0"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fuse_cli.analysis.measure"], input=json.dumps(request),
            capture_output=True, text=True, env=env, timeout=_CHILD_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        return _not_measurable(f"the measuring process ran past {_CHILD_TIMEOUT_S} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode < 0:  # a signal: onnxruntime crashed on the model, which is no error of the caller's
        return _not_measurable(f"onnxruntime crashed ({crash_description(done.returncode)}) running it")
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": f"the measuring process failed: {tail[:300]}"}
    return json.loads(lines[-1])


def _not_measurable(reason: str, baseline: int | None = None) -> dict:
    return {"peak_bytes": None, "baseline_bytes": baseline, "reason": reason}


def measure_here(request: Mapping, clear_refs: str = CLEAR_REFS, status: str = STATUS) -> dict:
    """The child's side, in this process: {"peak_bytes", "baseline_bytes", "reason"} or
    {"error"}. Meaningful only in a fresh process started with the environment `_run_child`
    sets; the paths are parameters so a test can point them elsewhere."""
    if not os.path.exists(clear_refs) or not os.path.exists(status):
        return _not_measurable(f"{clear_refs} is missing: resetting the RSS high-water mark needs Linux")
    if not _glibc_version():
        return _not_measurable("the C library is not glibc, so freed buffers need not go back to the "
                               "kernel and RSS would not follow onnxruntime's allocations")
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != str(_MMAP_THRESHOLD):
        # glibc reads it at process start: too late to set it here.
        return _not_measurable("glibc's mmap threshold was not pinned when this process started, "
                               "so freed buffers may stay resident and hide the peak")

    import numpy as np

    try:
        session = _session(request["model"], request.get("by_reference", False), request.get("stored_order", False))
        feeds = _feeds(session, request["shapes"], request["seed"], request.get("int_ranges", {}))
        session.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own exception types
        return {"error": f"onnxruntime cannot run the model: {str(exc).strip().splitlines()[0][:300]}"}

    peaks: list[int] = []
    baseline = None
    for _ in range(request["repeats"]):
        rss = _status_bytes(status, "VmRSS")
        baseline = rss if baseline is None else baseline
        try:
            with open(clear_refs, "w") as f:
                f.write("5")
        except OSError as exc:
            return _not_measurable(f"writing 5 to {clear_refs} was refused ({exc.strerror or exc}): "
                                   "the RSS high-water mark cannot be reset", baseline)
        if _status_bytes(status, "VmHWM") > _status_bytes(status, "VmRSS") + _RESET_SLACK_BYTES:
            return _not_measurable(f"writing 5 to {clear_refs} did not reset VmHWM", baseline)
        copies = {name: np.array(value, copy=True) for name, value in feeds.items()}
        outputs = session.run(None, copies)
        peaks.append(_status_bytes(status, "VmHWM") - rss)
        del outputs, copies
    allocated, allocated_reason = allocated_peak(session, feeds)
    return {"peak_bytes": max(min(peaks), 0), "baseline_bytes": baseline, "reason": None,
            "allocated_bytes": allocated, "allocated_reason": allocated_reason}


def allocated_peak(session, feeds: Mapping) -> tuple[int | None, str | None]:
    """The most bytes held from the C allocator at once during one run of `session`, inputs
    copied first and outputs held, as the estimate counts them: (bytes, None), or (None, why not).
    Allocations made before the run (weights, the session, the warm-up's leftovers) are not
    tracked, and their frees are ignored, so the figure is the run's own."""
    try:
        import memray
    except ImportError:
        return None, "memray is not installed (pip install 'fuse-cli[measure]')"
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="fuse-allocations-") as tmp:
        capture = Path(tmp) / "run.bin"
        with memray.Tracker(str(capture), native_traces=False, follow_fork=False):
            copies = {name: np.array(value, copy=True) for name, value in feeds.items()}
            outputs = session.run(None, copies)
            del outputs, copies
        return int(memray.FileReader(str(capture)).metadata.peak_memory), None


def _session(path: str, by_reference: bool = False, stored_order: bool = False):
    """One thread, graph optimizations, arena and memory pattern off: freed buffers go back to the
    system, so RSS follows onnxruntime's allocations."""
    from fuse_cli.core.sessions import make_session

    model = onnx.load(path, load_external_data=False) if by_reference else path
    return make_session(model, threads=1, lean_memory=True, stored_order=stored_order)


def _feeds(session, shapes: Mapping[str, Sequence[int]], seed: int,
           int_ranges: Mapping[str, Sequence[int]] = _NO_BINDINGS) -> dict:
    """core.feeds.random_inputs' data, at exactly the shapes asked for."""
    from fuse_cli.core.feeds import position_key, random_inputs

    # every fed dim by its position key, which random_inputs reads before any name
    dims = {position_key(name, index): int(value) for name, shape in shapes.items()
            for index, value in enumerate(shape)}
    ranges = {name: (int(low), int(high)) for name, (low, high) in int_ranges.items()}
    return random_inputs(session, dims=dims, seed=seed, int_ranges=ranges)


def _glibc_version() -> str | None:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):  # not POSIX, or a C library without the name
        return None


def _status_bytes(path: str, key: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    raise OSError(f"{path} has no {key} line")


def _main() -> None:
    request = json.loads(sys.stdin.read())
    print(json.dumps(measure_here(request)))


if __name__ == "__main__":
    _main()
