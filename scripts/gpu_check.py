"""`make gpu-check`: fuse's `--target ort-cuda` outputs on onnxruntime's CUDA provider (issue 34).

Per model of the fixed subset (scripts/gpu_models.py: a CNN, BERT, ViT, an LLM prefill and
decode step, each in float32 and float16): `fuse optimize --target ort-cuda` at default flags,
then on the GPU
- verification: the fused model on CUDA against the original on the CPU (graph optimizations
  off, the reference), beside the original on CUDA against the same reference (the runtime's own
  difference, which bounds what the fused model can be asked for);
- time: original and fused on CUDA, inputs and outputs on the device (IOBinding), in interleaved
  rounds that alternate which goes first; the median per run of each and their ratio;
- memory: the growth of device memory (NVML) over one run in a fresh session of each model (a
  child process per model, onnxruntime's arena growing by exactly what is asked, memory pattern
  and graph optimizations off, so the arena holds what the planner fuse replays allocated),
  against fuse's estimate (`fuse report --target ort-cuda`'s peak) before and after fusion.
It writes benchmarks/results/gpu.md and exits 1 if a fused output does not verify. Where
onnxruntime's CUDA provider does not load it says so in one line and exits 0.

On a lent GPU machine (bare, no network; /work/.library/device/README.md): first, here, in the
checkout the session was started in (the one a `run` call sends), `scripts/gpu_prepare.sh` puts
the packed onnxruntime-gpu and onnx-graphsurgeon in .whl/ (git-ignored); then one call,
run(carry=[".whl"], timeout_s=560, command=<the lines below>):

python3 -m tarfile -e .whl/onnxruntime-gpu-sm90.tar.xz /tmp/site || exit
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1; nvidia-smi -L
python3 scripts/gpu_check.py --out $OUT/gpu.md 2>&1 | tee $OUT/gpu.log

and copy the gpu.md it returns over benchmarks/results/gpu.md. The packed build runs on sm_90
only (H100, H200). No case starts with under 45 s of --budget-s (480 s) left, so the check ends
within about 8 minutes; gpu.md is rewritten after each case, so a run cut short still returns one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from check_cuda import cuda_loads, rerun_with_cuda_libraries  # noqa: E402
from gpu_models import SUBSET, Case  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu.md"
# TF32 off: onnxruntime's CUDA MatMuls use it by default on Ampere and later, a 1e-3 error in any
# float32 model that would hide the fusions' own; timed the same way for both models.
CUDA = [("CUDAExecutionProvider", {"use_tf32": "0", "arena_extend_strategy": "kSameAsRequested"})]
# for the memory figure: cuDNN's default exhaustive search tries convolution algorithms with
# workspaces taken from the same arena (up to all free memory), which is not the model's memory
CUDA_MEASURED = [("CUDAExecutionProvider", {**CUDA[0][1], "cudnn_conv_algo_search": "HEURISTIC",
                                            "cudnn_conv_use_max_workspace": "0"})]
# GPU kernels sum in other orders than the CPU's: per dtype, looser than fuse's verification
TOLERANCES = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2)}
# a case needs about this long (build, fuse, sessions, rounds): one is not started with less left
CASE_SECONDS = 45
MiB = 2**20


@dataclass(frozen=True)
class Row:
    """One case's measurements; None where that part was not measured (`note` says why)."""

    model: str
    dtype: str
    dims: str
    contrib_ops: str = ""
    nodes_before: int | None = None
    nodes_after: int | None = None
    fused_diff: float | None = None  # max abs difference, fused on CUDA vs original on CPU
    original_diff: float | None = None  # the same for the original on CUDA
    verified: bool | None = None
    original_ms: float | None = None
    fused_ms: float | None = None
    measured_before: int | None = None  # device memory one run adds, bytes
    measured_after: int | None = None
    estimate_before: int | None = None
    estimate_after: int | None = None
    note: str = ""


COLUMNS = ("model", "dtype", "dims", "fused operators", "nodes", "max abs diff fused / original on CUDA",
           "verified", "ms original", "ms fused", "fused / original", "measured MiB before / after",
           "estimate MiB before / after", "estimate / measured after", "note")


def _ratio(a: float | int | None, b: float | int | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def _pair(a, b, form) -> str:
    return "n/a" if a is None and b is None else f"{form(a)} / {form(b)}"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MiB:.1f}"


def _ms(t: float | None) -> str:
    return "n/a" if t is None else f"{t:.3f}"


def _diff(d: float | None) -> str:
    return "n/a" if d is None else f"{d:.2g}"


def table_row(row: Row) -> list[str]:
    verified = {True: "yes", False: "NO", None: "n/a"}[row.verified]
    return [row.model, row.dtype, row.dims, row.contrib_ops or "-",
            _pair(row.nodes_before, row.nodes_after, lambda n: "n/a" if n is None else str(n)),
            _pair(row.fused_diff, row.original_diff, _diff), verified, _ms(row.original_ms), _ms(row.fused_ms),
            _ratio(row.fused_ms, row.original_ms), _pair(row.measured_before, row.measured_after, _mib),
            _pair(row.estimate_before, row.estimate_after, _mib), _ratio(row.estimate_after, row.measured_after),
            row.note.replace("|", "/")]


def render(rows: list[Row], device: str, seconds: float, when: datetime, floor_bytes: int | None = None) -> str:
    slower = [f"{r.model} {r.dtype}" for r in rows if r.fused_ms and r.original_ms and r.fused_ms > r.original_ms]
    failed = [f"{r.model} {r.dtype}" for r in rows if r.verified is False]
    lines = [f"# fuse `--target ort-cuda` on CUDA ({when:%Y-%m-%d})", "",
             f"Device: {device}. Written by `make gpu-check` (scripts/gpu_check.py) in {seconds:.0f} s.", "",
             "Models built in code (scripts/gpu_models.py), fused by `fuse optimize --target ort-cuda` at default "
             "flags. Verification: fused on CUDA against the original on the CPU, beside the original on CUDA "
             "against the same reference (max abs difference; TF32 off). Time: median per run of interleaved "
             "rounds on CUDA, inputs and outputs on the device, graph optimizations on (ENABLE_ALL). Memory: "
             "device memory (NVML) added by one run in a fresh session, arena growing by what is asked, memory "
             "pattern and graph optimizations off; estimate: fuse's peak before and after fusion.", "",
             f"A one-MatMul model adds {_mib(floor_bytes)} MiB the same way (the session's library handles and "
             "workspaces, not activations): a floor under every measured figure.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    lines += ["", f"Verified: {sum(r.verified is True for r in rows)} of {len(rows)}"
              + (f"; NOT verified: {', '.join(failed)}" if failed else "") + ".",
              f"Fused slower than the original on CUDA: {', '.join(slower) or 'none'}.", ""]
    return "\n".join(lines)


# ---- the measurements (need onnxruntime-gpu and a GPU) ---------------------------------------

def session(path: Path, providers, *, level: str = "ORT_ENABLE_ALL", lean: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    if lean:
        options.enable_mem_pattern = False
    made = ort.InferenceSession(str(path), options, providers=providers)
    asked = {p if isinstance(p, str) else p[0] for p in providers}
    if "CUDAExecutionProvider" in asked and "CUDAExecutionProvider" not in made.get_providers():
        raise RuntimeError(f"asked for CUDA, got {made.get_providers()}")
    return made


def device_run(sess, feeds: dict[str, np.ndarray]):
    """A closure that runs `sess` once on device-resident inputs, outputs left on the device, and
    returns when the device is done."""
    import onnxruntime as ort

    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for output in sess.get_outputs():
        binding.bind_output(output.name, "cuda")

    def once() -> None:
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
    return once


def interleaved_ms(original, fused, rounds: int = 9, round_seconds: float = 0.1) -> tuple[float, float]:
    """Median milliseconds per run of each closure: each round runs both `n` times, the order
    alternating, so a clock or thermal drift lands on both alike."""
    for run in (original, fused, original, fused):  # warm-up: kernel loads, tuning, arena growth
        run()
    start = time.perf_counter()
    original()
    n = max(1, min(200, int(round_seconds / max(time.perf_counter() - start, 1e-6))))
    times: dict[int, list[float]] = {0: [], 1: []}
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            run = (original, fused)[which]
            start = time.perf_counter()
            for _ in range(n):
                run()
            times[which].append((time.perf_counter() - start) * 1000 / n)
    return statistics.median(times[0]), statistics.median(times[1])


def device_memory_growth(feeds_path: Path, *paths: Path) -> list[int]:
    """In this (child) process, per model: device memory one run adds in a fresh CUDA session. A
    first session runs the model once and is dropped, so the kernels' code and the libraries'
    handles are loaded before the measured one starts."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    feeds = dict(np.load(feeds_path))
    growth = []
    for path in paths:
        warm = session(path, CUDA_MEASURED, level="ORT_DISABLE_ALL", lean=True)
        warm.run(None, feeds)
        del warm
        measured = session(path, CUDA_MEASURED, level="ORT_DISABLE_ALL", lean=True)
        before = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        measured.run(None, feeds)
        growth.append(pynvml.nvmlDeviceGetMemoryInfo(handle).used - before)
        del measured
    return growth


def measured_growth(feeds_path: Path, *paths: Path) -> list[int | None]:
    """device_memory_growth in a child process (one CUDA start for all the models), None each
    where it failed, the reason on stderr."""
    child = subprocess.run([sys.executable, __file__, "--memory-of", str(feeds_path), *map(str, paths)],
                           capture_output=True, text=True, timeout=300)
    if child.returncode != 0:
        why = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
        print(f"gpu-check: device memory of {', '.join(p.name for p in paths)} not measured: {why}", file=sys.stderr)
        return [None] * len(paths)
    return json.loads(child.stdout.strip().splitlines()[-1])


def left_out(report) -> str:
    """The passes fuse left out of this output, and why: what the table's numbers do not include."""
    guard = sorted({d.pass_name for d in report.peak_guard})
    rolled = sorted({r.pass_name for r in report.rolled_back})
    return "; ".join(part for part in (f"peak guard left out {', '.join(guard)}" if guard else "",
                                       f"rolled back {', '.join(rolled)}" if rolled else "") if part)


def run_case(case: Case, scratch: Path) -> Row:
    from fuse_cli import api
    from fuse_cli.config import FuseConfig
    from fuse_cli.core.feeds import random_inputs
    from fuse_cli.verify import compare_outputs

    dims = ", ".join(f"{k}={v}" for k, v in case.dims.items())
    row = Row(case.name, case.dtype, dims)
    original_path = scratch / f"{case.name}-{case.dtype}.onnx"
    fused_path = scratch / f"{case.name}-{case.dtype}.fused.onnx"
    onnx.save(case.model(), str(original_path))
    result = api.optimize(original_path, FuseConfig(target="ort-cuda", dims=case.dims, int_ranges=case.int_ranges),
                          fused_path)
    fused_model = onnx.load(str(fused_path), load_external_data=False)
    contrib = sorted({n.op_type for n in fused_model.graph.node if n.domain == "com.microsoft"})
    memory = result.report.memory
    row = replace(row, contrib_ops=", ".join(contrib), nodes_before=result.report.nodes_before,
                  note=left_out(result.report),
                  nodes_after=result.report.nodes_after,
                  estimate_before=memory.before.peak_bytes if memory else None,
                  estimate_after=memory.after.peak_bytes if memory else None)

    reference = session(original_path, ["CPUExecutionProvider"], level="ORT_DISABLE_ALL")
    feeds = random_inputs(reference, dims=case.dims, int_ranges=case.int_ranges, seed=0)
    expected = dict(zip([o.name for o in reference.get_outputs()], reference.run(None, feeds)))
    del reference
    original, fused = session(original_path, CUDA), session(fused_path, CUDA)
    rtol, atol = TOLERANCES[case.dtype]

    def worst(sess) -> tuple[float, bool]:
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        comparison = compare_outputs(expected, got, rtol=rtol, atol=atol)
        return max(o.max_abs_diff for o in comparison.outputs), comparison.passed

    fused_diff, passed = worst(fused)
    original_diff, _ = worst(original)
    # where the runtime itself differs from the CPU by more than the tolerance, the fused model
    # is held to what the original on CUDA does, with room for its own rounding
    verified = passed or fused_diff <= 2 * original_diff
    original_ms, fused_ms = interleaved_ms(device_run(original, feeds), device_run(fused, feeds))
    del original, fused
    feeds_path = scratch / f"{case.name}-{case.dtype}.npz"
    np.savez(feeds_path, **feeds)
    measured_before, measured_after = measured_growth(feeds_path, original_path, fused_path)
    return replace(row, fused_diff=fused_diff, original_diff=original_diff, verified=verified,
                   original_ms=original_ms, fused_ms=fused_ms, measured_before=measured_before,
                   measured_after=measured_after)


def device_name() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        return f"{name}, driver {pynvml.nvmlSystemGetDriverVersion()}"
    except Exception as exc:  # NVML missing or not answering: the table still stands
        return f"unnamed CUDA device (NVML: {exc})"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def one_matmul(scratch: Path) -> tuple[Path, Path]:
    """A model with one small MatMul and its inputs: what a session adds to device memory beyond
    the activations (cuBLAS's handle and workspace) is measured on it."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 8])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 8])
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "x"], ["y"])], "one_matmul", [x], [y])
    path, feeds = scratch / "one_matmul.onnx", scratch / "one_matmul.npz"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), str(path))
    np.savez(feeds, x=np.ones((8, 8), np.float32))
    return path, feeds


def run_subset(cases: list[Case], budget_s: float, out: Path) -> list[Row]:
    """Each case in turn, gpu.md rewritten after each; a case that fails is a row that says so."""
    started, device = time.monotonic(), device_name()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        matmul, matmul_feeds = one_matmul(Path(scratch))
        floor, = measured_growth(matmul_feeds, matmul)
        for case in cases:
            left = budget_s - (time.monotonic() - started)
            if left < CASE_SECONDS:
                rows.append(Row(case.name, case.dtype, "", note=f"not run: {left:.0f} s of the budget left"))
            else:
                try:
                    rows.append(run_case(case, Path(scratch)))
                except Exception as exc:  # one model's failure is a row of the table, not the end of the check
                    traceback.print_exc()  # to the log the GPU machine returns: its one run must say why
                    first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
                    rows.append(Row(case.name, case.dtype, "", verified=False, note=f"failed: {first_line}"))
            print(" | ".join(table_row(rows[-1])), flush=True)
            write(out, render(rows, device, time.monotonic() - started, datetime.now(timezone.utc), floor))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fuse's ort-cuda outputs on CUDA: verify, time, memory")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--budget-s", type=float, default=480.0, help="no case starts with under 45 s of it left")
    parser.add_argument("--only", default="", help="comma-separated model names: " + ", ".join(dict.fromkeys(
        c.name for c in SUBSET)))
    parser.add_argument("--memory-of", nargs="+", type=Path, help=argparse.SUPPRESS)  # FEEDS MODEL...
    args = parser.parse_args(argv)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {c.name for c in SUBSET}
    if unknown:
        print(f"gpu-check: no model named {', '.join(sorted(unknown))} (--only)", file=sys.stderr)
        return 2
    rerun_with_cuda_libraries()
    if args.memory_of:
        print(json.dumps(device_memory_growth(*args.memory_of)))
        return 0
    ok, reason = cuda_loads()
    if not ok:
        print(f"gpu-check: not run: {reason}")
        return 0
    rows = run_subset([c for c in SUBSET if not wanted or c.name in wanted], args.budget_s, args.out)
    print(args.out.read_text())
    return 1 if any(r.verified is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
