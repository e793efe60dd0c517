"""Rank-3 Linear layer: is Reshape -> Gemm -> Reshape faster than MatMul + Add in onnxruntime CPU?

A transformer Linear layer on a [batch, sequence, hidden] activation has two exact forms in
standard ONNX (opset 17, fp32):

  (a) y = Add(bias, MatMul(x[B,S,K], W[K,N]))                  the form torch exports
  (b) y = Reshape(Gemm(Reshape(x, [-1, K]), W, bias), shape)   bias folded into the Gemm

The back-reshape of (b) needs B and S. With the input declared with symbolic dims (as exporters
write it) the exact form computes them: shape = Concat(Shape(x, start=0, end=-1), [N]). A
constant [0, 0, N] is NOT valid there: 0 copies a dim of the Reshape's own (2-D) data input, so it
would ask for [B*S, N, N]. With the input declared with fixed dims the shape is the constant
[B, S, N]. Both declarations are measured, because onnxruntime's own MatMulAddFusion (from
ORT_ENABLE_BASIC up) rewrites (a) into exactly (b) when the shapes are static and leaves it alone
when they are symbolic; the script prints the graph onnxruntime runs at each level.

Timing: onnxruntime CPU provider, one intra-op and one inter-op thread (every kernel runs on the
calling thread, so time.thread_time is the model's work), graph optimizations disabled and at
ORT_ENABLE_ALL. Both sessions of a cell are warmed up, then timed in alternating rounds (one
sample of each per round, the order swapping every round) so that load from other processes hits
both alike; a sample is enough back-to-back runs to last a few milliseconds of CPU. Figures are
the median per run over all samples, in CPU and wall microseconds; "paired" is the median and
quartiles of the per-round ratio b/a. Memory: peak activation memory of each form with
optimizations disabled, by fuse_cli.analysis.measure.measure_peak (child process, arena and
memory pattern off: input copy + every buffer written + the output), and of the graph
onnxruntime makes at ORT_ENABLE_EXTENDED (saved, then measured the same way). Numerics: both forms
against a float64 reference, at the benchmark shape and at other batch/sequence sizes through the
symbolic-dim models (including an empty batch).

    .venv/bin/python benchmarks/matmul_add_rank3.py [--rounds 201] [--cell-budget 15] [--shape B,S,K,N ...]
                                                    [--quick] [--no-memory] [--out FILE] [--conclusion FILE]

Writes benchmarks/results/matmul_add_rank3.md (or --out).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli.analysis.measure import measure_peak  # noqa: E402

OPSET = 17
IR_VERSION = 8  # onnxruntime 1.31 rejects the IR version onnx 1.23 writes by default
# (B, S, K, N): BERT-base QKV/out projection, BERT-base FFN up, a batch of 8, a 1024-wide FFN up
# at sequence 512, and a small one where per-node overhead dominates.
SHAPES = ((1, 16, 64, 64), (1, 128, 768, 768), (1, 128, 768, 3072), (8, 128, 768, 768), (1, 512, 1024, 4096))
LEVELS = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
DECLS = ("symbolic", "static")
CONTEXTS = ("output", "interior")
FORMS = ("a", "b")
SAMPLE_CPU_S = 0.004  # a sample lasts at least this much CPU time
TOLERANCE = 0.03      # |ratio - 1| under this (or quartiles straddling 1) reads as "equal"


# --- the models ----------------------------------------------------------------------------------


def weights(k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.normal(0.0, k ** -0.5, size=(k, n)).astype(np.float32)
    bias = rng.uniform(-0.1, 0.1, size=n).astype(np.float32)
    return w, bias


def build(form: str, decl: str, b: int, s: int, k: int, n: int, context: str = "output") -> onnx.ModelProto:
    """Form (a) MatMul + Add(bias, .) or (b) Reshape -> Gemm -> Reshape; input dims fixed or
    symbolic ("batch", "sequence"); y the graph output, or ("interior") feeding a consumer."""
    w, bias = weights(k, n)
    lead = [b, s] if decl == "static" else ["batch", "sequence"]
    inits = [numpy_helper.from_array(w, "weight"), numpy_helper.from_array(bias, "bias")]
    if form == "a":
        nodes = [helper.make_node("MatMul", ["x", "weight"], ["matmul_out"], name="matmul"),
                 # torch writes Add(bias, MatMul) for a Linear layer
                 helper.make_node("Add", ["bias", "matmul_out"], ["y"], name="add")]
    else:
        inits.append(numpy_helper.from_array(np.array([-1, k], np.int64), "flat_shape"))
        nodes = [helper.make_node("Reshape", ["x", "flat_shape"], ["x2d"], name="to_2d"),
                 helper.make_node("Gemm", ["x2d", "weight", "bias"], ["y2d"], name="gemm")]
        if decl == "static":
            inits.append(numpy_helper.from_array(np.array([b, s, n], np.int64), "out_shape"))
        else:
            inits.append(numpy_helper.from_array(np.array([n], np.int64), "last_dim"))
            nodes += [helper.make_node("Shape", ["x"], ["lead_dims"], name="lead_dims", start=0, end=-1),
                      helper.make_node("Concat", ["lead_dims", "last_dim"], ["out_shape"], name="out_shape", axis=0)]
        nodes.append(helper.make_node("Reshape", ["y2d", "out_shape"], ["y"], name="to_3d"))
    if context == "interior":
        # y is an intermediate, as in a model: a consumer with a small output (so the memory
        # figure shows the Linear's own buffers) reads it
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "last_axis"))
        nodes.append(helper.make_node("ReduceSum", ["y", "last_axis"], ["z"], name="consumer", keepdims=0))
        output = helper.make_tensor_value_info("z", TensorProto.FLOAT, lead)
    else:
        output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])
    graph = helper.make_graph(nodes, f"linear_{form}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])], [output], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)  # also runs strict shape inference
    return model


def session(model: onnx.ModelProto, level, save_to: str | None = None, arena: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = level
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = arena
    if save_to:
        options.optimized_model_filepath = save_to
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_graph(model: onnx.ModelProto, level) -> tuple[str, onnx.ModelProto]:
    """The node list onnxruntime runs at `level`, and that graph as a model."""
    with tempfile.TemporaryDirectory(prefix="mar3-") as tmp:
        path = os.path.join(tmp, "opt.onnx")
        session(model, level, save_to=path)
        optimized = onnx.load(path)
    ops = " -> ".join(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                      for n in optimized.graph.node)
    return ops, optimized


# --- timing --------------------------------------------------------------------------------------


@dataclass
class Cell:
    shape: tuple[int, int, int, int]
    context: str
    decl: str
    level: str
    cpu_us: dict[str, float]
    wall_us: dict[str, float]
    paired: tuple[float, float, float]  # per-round CPU ratio b/a: p25, median, p75
    rounds: int
    reps: int

    @property
    def ratio(self) -> float:
        return self.cpu_us["b"] / self.cpu_us["a"]

    @property
    def wall_ratio(self) -> float:
        return self.wall_us["b"] / self.wall_us["a"]

    @property
    def verdict(self) -> str:
        lo, _, hi = self.paired
        if self.ratio < 1 - TOLERANCE and hi < 1:
            return "faster"
        if self.ratio > 1 + TOLERANCE and lo > 1:
            return "slower"
        return "equal"


def _sample(sess: ort.InferenceSession, feed: dict, reps: int) -> tuple[float, float]:
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(reps):
        sess.run(None, feed)
    return (time.thread_time() - c0) / reps, (time.perf_counter() - w0) / reps


def time_cell(shape, context: str, decl: str, level: str, rounds: int, budget_s: float) -> Cell:
    b, s, k, n = shape
    sessions = {f: session(build(f, decl, b, s, k, n, context), LEVELS[level]) for f in FORMS}
    feed = {"x": np.random.default_rng(1).standard_normal((b, s, k)).astype(np.float32)}
    # warm-up (prepacking, first allocations, caches): at least 10 runs and 0.2 s of CPU per form
    per_run = {}
    for f, sess in sessions.items():
        start, count = time.thread_time(), 0
        while count < 10 or time.thread_time() - start < 0.2:
            sess.run(None, feed)
            count += 1
        per_run[f] = (time.thread_time() - start) / count
    reps = max(1, int(np.ceil(SAMPLE_CPU_S / min(per_run.values()))))
    round_s = reps * sum(per_run.values())
    rounds = max(15, min(rounds, int(budget_s / round_s)))
    cpu: dict[str, list[float]] = {f: [] for f in FORMS}
    wall: dict[str, list[float]] = {f: [] for f in FORMS}
    for r in range(rounds):
        for f in (FORMS if r % 2 == 0 else FORMS[::-1]):
            c, w = _sample(sessions[f], feed, reps)
            cpu[f].append(c)
            wall[f].append(w)
    pair = np.array(cpu["b"]) / np.array(cpu["a"])
    p25, p50, p75 = np.percentile(pair, [25, 50, 75])
    return Cell(shape, context, decl, level, {f: statistics.median(v) * 1e6 for f, v in cpu.items()},
                {f: statistics.median(v) * 1e6 for f, v in wall.items()}, (p25, p50, p75), rounds, reps)


# --- numerics and memory -------------------------------------------------------------------------


def check_numerics(shape) -> list[str]:
    """Max abs error of each form against float64, at the benchmark shape and, through the
    symbolic-dim models, at other batch/sequence sizes (the Shape-based back-reshape must follow)."""
    b, s, k, n = shape
    w, bias = weights(k, n)
    lines = []
    for level in LEVELS:
        for decl in DECLS:
            probes = [(b, s)] if decl == "static" else [(b, s), (3, 5), (2, 1), (0, 7)]
            sess = {f: session(build(f, decl, b, s, k, n), LEVELS[level]) for f in FORMS}
            for pb, ps in probes:
                x = np.random.default_rng(2).standard_normal((pb, ps, k)).astype(np.float32)
                ref = x.astype(np.float64) @ w.astype(np.float64) + bias.astype(np.float64)
                out = {f: sess[f].run(None, {"x": x})[0] for f in FORMS}
                for f, y in out.items():
                    if y.shape != ref.shape:
                        raise AssertionError(f"form {f} {decl} {level}: shape {y.shape}, expected {ref.shape}")
                err = {f: float(np.abs(out[f] - ref).max()) if ref.size else 0.0 for f in FORMS}
                ab = float(np.abs(out["a"] - out["b"]).max()) if ref.size else 0.0
                lines.append(f"{','.join(map(str, shape))} {decl:<8} {level:<8} x={[pb, ps, k]}: "
                             f"|a-ref| {err['a']:.1e}, |b-ref| {err['b']:.1e}, |a-b| {ab:.1e}")
    return lines


def memory(shape) -> dict:
    """Peak activation bytes per (context, graph, form): the graph as written, with optimizations
    disabled, and the graph onnxruntime makes at ORT_ENABLE_EXTENDED from the static-shape model."""
    b, s, k, n = shape
    dims = {"batch": b, "sequence": s}
    out = {}
    for context in CONTEXTS:
        for f in FORMS:
            out[(context, "written", f)] = measure_peak(build(f, "symbolic", b, s, k, n, context), dims=dims,
                                                        repeats=3).peak_bytes
            _, extended = ort_graph(build(f, "static", b, s, k, n, context),
                                    ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
            out[(context, "ort", f)] = measure_peak(extended, repeats=3).peak_bytes
    return out


def size(v: int | None) -> str:
    if v is None:
        return "-"
    return f"{v / 2 ** 20:.2f} MiB" if v >= 2 ** 20 else f"{v / 2 ** 10:.0f} KiB"


# --- report --------------------------------------------------------------------------------------


def verdict_summary(cells: list[Cell]) -> list[str]:
    lines = []
    for context in CONTEXTS:
        for level in LEVELS:
            for decl in DECLS:
                sel = [c for c in cells if (c.context, c.level, c.decl) == (context, level, decl)]
                if not sel:
                    continue
                counts = {v: sum(c.verdict == v for c in sel) for v in ("faster", "equal", "slower")}
                lines.append(f"- {context}, {level}, {decl}: (b) faster in {counts['faster']}, equal in "
                             f"{counts['equal']}, slower in {counts['slower']} of {len(sel)} shapes; CPU b/a "
                             f"{min(c.ratio for c in sel):.3f} to {max(c.ratio for c in sel):.3f}")
    return lines


CONCLUSION = """\
(no conclusion paragraph given: pass --conclusion FILE after reading the figures)"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=201, help="alternating rounds per cell (at most)")
    parser.add_argument("--cell-budget", type=float, default=15.0, help="seconds of runs per cell (caps the rounds)")
    parser.add_argument("--quick", action="store_true", help="few rounds, two smallest shapes (smoke test)")
    parser.add_argument("--shape", action="append", metavar="B,S,K,N",
                        help="time only this shape (repeatable; default: the five in SHAPES)")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "matmul_add_rank3.md")
    parser.add_argument("--conclusion", type=Path, help="a file holding the conclusion paragraph for the report")
    args = parser.parse_args()
    shapes = SHAPES[:2] if args.quick else SHAPES
    if args.shape:
        shapes = tuple(tuple(int(v) for v in text.split(",")) for text in args.shape)
        if any(len(shape) != 4 for shape in shapes):
            parser.error("--shape takes four integers B,S,K,N")
    rounds = 15 if args.quick else args.rounds

    cpu_name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu_name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"onnxruntime {ort.__version__}, fp32, 1 intra-op thread", flush=True)

    numerics: list[str] = []
    for shape in shapes:
        numerics += check_numerics(shape)
    print("\n".join(numerics), flush=True)

    graphs = ["| declared | level | (a) runs as | (b) runs as |", "|---|---|---|---|"]
    b, s, k, n = shapes[0]
    for decl in DECLS:
        for name, level in (("disabled", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                            ("basic", ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
                            ("extended", ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
                            ("all", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
            ops = [ort_graph(build(f, decl, b, s, k, n), level)[0] for f in FORMS]
            graphs.append(f"| {decl} | {name} | {ops[0]} | {ops[1]} |")
    print("\n".join(graphs), flush=True)

    table = ["| B,S,K,N | y is | declared | opt level | (a) CPU us | (b) CPU us | b/a | paired b/a [p25, p75] | "
             "(a) wall us | (b) wall us | wall b/a | rounds x runs | (b) is |",
             "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    print("\n" + "\n".join(table), flush=True)
    cells: list[Cell] = []
    for shape in shapes:
        for context in CONTEXTS:
            for decl in DECLS:
                for level in LEVELS:
                    c = time_cell(shape, context, decl, level, rounds, args.cell_budget)
                    cells.append(c)
                    lo, mid, hi = c.paired
                    row = (f"| {','.join(map(str, shape))} | {context} | {decl} | {level} | {c.cpu_us['a']:.1f} | "
                           f"{c.cpu_us['b']:.1f} | {c.ratio:.3f} | {mid:.3f} [{lo:.3f}, {hi:.3f}] | "
                           f"{c.wall_us['a']:.1f} | {c.wall_us['b']:.1f} | {c.wall_ratio:.3f} | "
                           f"{c.rounds}x{c.reps} | {c.verdict} |")
                    table.append(row)
                    print(row, flush=True)

    mem = ["| B,S,K,N | x | y | y is | (a) as written | (b) as written | (a) ORT-optimized | (b) ORT-optimized |",
           "|---|---:|---:|---|---:|---:|---:|---:|"]
    if not args.no_memory:
        for shape in shapes:
            m = memory(shape)
            bb, ss, kk, nn = shape
            for context in CONTEXTS:
                mem.append(f"| {','.join(map(str, shape))} | {size(bb * ss * kk * 4)} | {size(bb * ss * nn * 4)} | "
                           f"{context} | {size(m[(context, 'written', 'a')])} | {size(m[(context, 'written', 'b')])} | "
                           f"{size(m[(context, 'ort', 'a')])} | {size(m[(context, 'ort', 'b')])} |")
        print("\n" + "\n".join(mem), flush=True)

    summary = verdict_summary(cells)
    print("\n" + "\n".join(summary))
    load1 = os.getloadavg()
    header = (f"{started}, {cpu_name}, {os.cpu_count()} CPUs, Python {platform.python_version()}, onnx "
              f"{onnx.__version__}, onnxruntime {ort.__version__}, numpy {np.__version__}. fp32, opset {OPSET}, "
              f"CPU provider, 1 intra-op / 1 inter-op thread. Load average (1 min) {load0[0]:.2f} at the start, "
              f"{load1[0]:.2f} at the end: other processes share the cores, so read CPU time first.")
    text = args.conclusion.read_text().strip() if args.conclusion else CONCLUSION
    report = [
        "# MatMul + Add vs Reshape -> Gemm -> Reshape on rank-3 activations", "", header, "",
        "Produced by `benchmarks/matmul_add_rank3.py` (its docstring gives the method). (a) = Add(bias [N], "
        "MatMul(x [B,S,K], W [K,N])); (b) = Reshape(x, [-1,K]) -> Gemm(W, bias) -> Reshape(back to [B,S,N]). "
        "`symbolic`: x declared [batch, sequence, K], (b)'s back-shape Concat(Shape(x, start=0, end=-1), [N]) "
        "(two more nodes); `static`: x declared [B,S,K], back-shape the constant [B,S,N]. `y is output`: the "
        "Linear's result is the graph output; `interior`: it feeds a consumer (ReduceSum over the last axis, "
        "output [B,S]), as a Linear inside a model does.", "",
        "## Conclusion", "", text, "",
        "Per context, level and declaration (faster/slower only where the CPU ratio is more than "
        f"{TOLERANCE:.0%} from 1 and the quartiles of the per-round ratio are on that side of 1):", "",
        *summary, "",
        "## Time", "",
        "CPU/wall: median microseconds per run (time.thread_time / perf_counter), the two forms timed in "
        "alternating rounds; b/a: ratio of the CPU medians; paired: the per-round CPU ratio b/a, median "
        "[p25, p75].", "",
        *table, "",
        "## The graph onnxruntime runs (y the graph output)", "", *graphs, "",
        "## Peak activation memory", "",
        "`fuse_cli.analysis.measure.measure_peak`: a child process, graph optimizations, arena and memory "
        "pattern off; it counts the input copy, every buffer live at the peak and the graph output. `as "
        "written`: the symbolic-dim model itself. `ORT-optimized`: the graph onnxruntime makes at "
        "ORT_ENABLE_EXTENDED from the static-shape model, saved and measured the same way. Noise: tens of "
        "pages.", "",
        *mem, "",
        "## Numerics", "",
        "Max abs difference to a float64 reference, y the graph output; the symbolic-dim models also run "
        "at other batch/sequence sizes than they were built for, an empty batch included.", "",
        "```", *numerics, "```", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(report))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
