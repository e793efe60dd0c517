"""What fuse does to quantized models, and what onnxruntime then forms from them (issue 32, item 4).

For every model benchmarks/corpus/quantized.py made (its manifest.json):

- fuse at `--target onnx` and `--target ort-cpu`: nodes before and after, verification status,
  the passes that fired;
- what onnxruntime's offline optimizer forms at ORT_ENABLE_EXTENDED on the CPU provider
  (optimized_model_filepath) from the original and from each fuse output: the quantized operators
  it makes (QLinearConv, QLinearMatMul, QLinearAdd, QAttention, MatMulInteger,
  DynamicQuantizeMatMul, ...) and the Q/DQ left over. Equal counts mean fuse left every QDQ node
  unit as the quantizer wrote it;
- CPU latency (one thread, fuse_cli.bench.time_sessions: rounds interleaved, the median of each,
  the whole timing twice and the smaller median kept) of each fuse output and of onnxruntime's own
  extended-level offline output (the best anchor), over the original's, at ORT_DISABLE_ALL and at
  ORT_ENABLE_EXTENDED; "noise" is the original's second session over its first.

    .venv/bin/python benchmarks/corpus/quantized.py          # build/quantized-models
    .venv/bin/python benchmarks/quantized_bench.py --out benchmarks/results/quantized.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli import api  # noqa: E402
from fuse_cli.bench import Timing, make_session, time_sessions  # noqa: E402
from fuse_cli.config import FuseConfig  # noqa: E402
from fuse_cli.core.feeds import random_inputs  # noqa: E402

TARGETS = ("onnx", "ort-cpu")
LEVELS = ("disabled", "extended")
TIMING = Timing(min_seconds=0.5, max_samples=200)
# what "formed" counts: onnxruntime's quantized kernels, and the Q/DQ it could not absorb
QUANTIZED_OPS = ("QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool",
                 "QLinearAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
                 "QGemm", "QAttention", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                 "ConvInteger", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear")


@dataclass
class Output:
    """One model a tool wrote, and what onnxruntime forms from it offline."""

    nodes: int = 0
    detail: str = ""
    formed: dict[str, int] = field(default_factory=dict)
    emitted: dict[str, int] = field(default_factory=dict)  # the quantized operators in the file itself
    max_abs_diff: float | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    latency_ratio: dict[str, float] = field(default_factory=dict)
    error: str = ""


@dataclass
class Row:
    name: str
    form: str
    dims: dict[str, int]
    outputs: dict[str, Output]
    noise: dict[str, float] = field(default_factory=dict)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=REPO / "build" / "quantized-models")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "quantized.md")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", default="", help="comma-separated substrings of model names (default: all)")
    parser.add_argument("--unit-probe", action="store_true",
                        help="also time one QDQ Conv unit against its FusedConv form, and QDQ Softmax units against "
                             "QLinearSoftmax")
    parser.add_argument("--render", type=Path, nargs="+", default=None,
                        help="write --out from these --json files of earlier runs (parts run apart) instead of running")
    args = parser.parse_args()
    if args.render:
        rows = [Row(**r | {"outputs": {k: Output(**o) for k, o in r["outputs"].items()}})
                for path in args.render for r in json.loads(path.read_text())]
        with tempfile.TemporaryDirectory() as scratch:
            args.out.write_text(markdown(rows, unit_probes(Path(scratch)) if args.unit_probe else []))
        return 0
    manifest_path = args.models / "manifest.json"
    if not manifest_path.exists():
        print(f"no {manifest_path}: run benchmarks/corpus/quantized.py first", file=sys.stderr)
        return 2
    wanted = [s for s in args.only.split(",") if s]
    rows, unit = [], []
    with tempfile.TemporaryDirectory() as scratch:
        if args.unit_probe:
            unit = unit_probes(Path(scratch))
            print("\n".join(unit), flush=True)
        for entry in json.loads(manifest_path.read_text()):
            if wanted and not any(s in entry["name"] for s in wanted):
                continue
            rows.append(bench_model(args.models / entry["file"], entry, Path(scratch)))
            print(summary_line(rows[-1]), flush=True)
    args.out.write_text(markdown(rows, unit))
    if args.json:
        args.json.write_text(json.dumps([row.__dict__ | {"outputs": {k: v.__dict__ for k, v in row.outputs.items()}}
                                         for row in rows], indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def bench_model(path: Path, entry: dict, scratch: Path) -> Row:
    dims = entry["dims"]
    original = Output(nodes=len(onnx.load(path, load_external_data=False).graph.node))
    outputs: dict[str, Path] = {"original": path}
    row = Row(entry["name"], entry["form"], dims, {"original": original})
    for target in TARGETS:
        key, destination = f"fuse {target}", scratch / f"{path.stem}.{target}.onnx"
        row.outputs[key] = out = Output()
        try:
            report = api.optimize(path, FuseConfig(target=target, dims=dims), destination).report
        except Exception as exc:  # fuse refusing a model is a row, not the end of the run
            out.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            continue
        out.nodes = report.nodes_after
        fired = Counter(r.pass_name for r in report.fusions)
        out.detail = (report.verification.status if report.verification else "not verified") + (
            "; " + ", ".join(f"{p} {n}" for p, n in fired.items()) if fired else "")
        out.emitted = formed_counts(destination)
        outputs[key] = destination
    for key, source in list(outputs.items()):
        extended = scratch / f"{path.stem}.{key.replace(' ', '-')}.ort-extended.onnx"
        ort_extended(source, extended)
        row.outputs[key].formed = formed_counts(extended)
        if key == "original":
            outputs["ort extended"] = extended
            row.outputs["ort extended"] = Output(nodes=len(onnx.load(extended).graph.node), formed=original.formed)
    feeds = random_inputs(make_session(str(path)), dims=dims, seed=0)
    reference = make_session(str(path)).run(None, feeds)
    reads: dict[str, list[str]] = {}  # onnxruntime's saved models may keep inputs no node reads
    for key, source in outputs.items():
        session = make_session(str(source))
        reads[key] = [i.name for i in session.get_inputs()]
        got = session.run(None, {name: feeds[name] for name in reads[key]})
        row.outputs[key].max_abs_diff = max(float(np.max(np.abs(a.astype(np.float64) - b)))
                                            for a, b in zip(reference, got))
    keys = {"original": path, "original (2nd session)": path, **outputs}
    run_feeds = {k: {name: feeds[name] for name in reads.get(k, reads["original"])} for k in keys}
    for level in LEVELS:
        best = best_medians(keys, run_feeds, level)
        row.noise[level] = best["original (2nd session)"] / best["original"]
        for k in outputs:
            row.outputs[k].latency_ms[level] = best[k]
            row.outputs[k].latency_ratio[level] = best[k] / best["original"]
    return row


UNIT_SHAPE = [1, 64, 56, 56]


def unit_probes(scratch: Path) -> list[str]:
    """The unit tables' sections, headed."""
    return ["## One QDQ unit fused into a float operator", "",
            conv_unit_probe.__doc__.split(":")[0].replace("\n   ", "") + ".", "", *conv_unit_probe(scratch), "",
            "## QDQ Softmax units against QLinearSoftmax", "",
            softmax_unit_probe.__doc__.split(":")[0].replace("\n   ", "") + ".", "", *softmax_unit_probe(scratch)]


def conv_unit_probe(scratch: Path) -> list[str]:
    """One QDQ Conv + Relu unit at [1, 64, 56, 56] (64 -> 64, 3x3) as onnxruntime's quantizer writes
    it, against the same unit with Conv + Relu made com.microsoft FusedConv (what fused-conv did at
    ort-cpu before it left QDQ units alone): what onnxruntime forms from each, and CPU time."""
    paths = {"QDQ Conv + Relu": scratch / "unit.onnx", "FusedConv(Relu) inside the unit": scratch / "unit-fused.onnx"}
    for fused, path in zip((False, True), paths.values()):
        onnx.save(_conv_unit(fused), path)
    feeds = {"x": np.random.default_rng(0).standard_normal(UNIT_SHAPE).astype(np.float32)}
    best = {level: best_medians(paths, {k: feeds for k in paths}, level) for level in LEVELS}
    lines = ["| unit | formed offline (extended) | ms disabled | ms extended |", "|---|---|---|---|"]
    for key, path in paths.items():
        ort_extended(path, scratch / "unit-extended.onnx")
        lines.append(f"| {key} | {_formed(formed_counts(scratch / 'unit-extended.onnx'))} | "
                     f"{best['disabled'][key]:.3f} | {best['extended'][key]:.3f} |")
    return lines


def _conv_unit(fused: bool) -> onnx.ModelProto:
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    values = {"s": np.float32(0.05), "z": np.uint8(128), "w_s": np.float32(0.01), "w_z": np.int8(0),
              "w_q": rng.integers(-60, 60, (64, 64, 3, 3)).astype(np.int8), "b_s": np.float32(0.0005),
              "b_z": np.int32(0), "b_q": rng.integers(-100, 100, (64,)).astype(np.int32),
              "o_s": np.float32(0.04), "o_z": np.uint8(0)}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "s", "z"], ["x_q"]), node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]),
             node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
             node("DequantizeLinear", ["b_q", "b_s", "b_z"], ["b"])]
    if fused:
        nodes.append(node("FusedConv", ["x_dq", "w", "b"], ["r"], domain="com.microsoft", pads=[1, 1, 1, 1],
                          activation="Relu"))
    else:
        nodes += [node("Conv", ["x_dq", "w", "b"], ["c"], pads=[1, 1, 1, 1]), node("Relu", ["c"], ["r"])]
    nodes += [node("QuantizeLinear", ["r", "o_s", "o_z"], ["y_q"]),
              node("DequantizeLinear", ["y_q", "o_s", "o_z"], ["y"])]
    graph = helper.make_graph(nodes, "unit", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, UNIT_SHAPE)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, UNIT_SHAPE)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in values.items()])
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


SOFTMAX_SHAPES = ([4, 4, 64, 64], [1, 12, 8, 512], [4, 12, 128, 128], [1, 12, 197, 197])


def softmax_unit_probe(scratch: Path) -> list[str]:
    """Attention's QDQ Softmax unit as quantize_static writes it (u8, output scale 1/255, zero point
    0) at several shapes, against the same unit as com.microsoft QLinearSoftmax (what onnxruntime
    forms at ORT_ENABLE_EXTENDED): CPU time at ORT_DISABLE_ALL, and the unit's own at
    ORT_ENABLE_EXTENDED, where onnxruntime forms QLinearSoftmax from it"""
    lines = ["| shape | unit ms (disabled) | QLinearSoftmax ms (disabled) | QLinearSoftmax / unit "
             "| unit ms (extended) |", "|---|---|---|---|---|"]
    for shape in SOFTMAX_SHAPES:
        paths = {"unit": scratch / "softmax-unit.onnx", "formed": scratch / "softmax-formed.onnx"}
        for formed, path in zip((False, True), paths.values()):
            onnx.save(_softmax_unit(shape, formed), path)
        feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3}
        best = {level: best_medians(paths, {k: feeds for k in paths}, level) for level in LEVELS}
        lines.append(f"| {shape} | {best['disabled']['unit']:.3f} | {best['disabled']['formed']:.3f} | "
                     f"{best['disabled']['formed'] / best['disabled']['unit']:.2f} | {best['extended']['unit']:.3f} |")
    return lines


def _softmax_unit(shape: list[int], formed: bool) -> onnx.ModelProto:
    from onnx import helper, numpy_helper

    values = {"s": np.float32(6 / 255), "z": np.uint8(128), "o_s": np.float32(1 / 255), "o_z": np.uint8(0)}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "s", "z"], ["x_q"])]
    if formed:
        nodes.append(node("QLinearSoftmax", ["x_q", "s", "z", "o_s", "o_z"], ["y_q"], domain="com.microsoft",
                          axis=-1, opset=17))
    else:
        nodes += [node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"]), node("Softmax", ["x_dq"], ["p"], axis=-1),
                  node("QuantizeLinear", ["p", "o_s", "o_z"], ["y_q"])]
    nodes.append(node("DequantizeLinear", ["y_q", "o_s", "o_z"], ["y"]))
    graph = helper.make_graph(nodes, "softmax", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in values.items()])
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def best_medians(paths: dict[str, Path], feeds: dict[str, dict[str, np.ndarray]], level: str) -> dict[str, float]:
    """CPU median per model (ms) at `level`: the whole interleaved timing twice, the smaller median kept."""
    sessions = {k: make_session(str(p), level=level) for k, p in paths.items()}
    medians: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(2):
        for k, latency in time_sessions(sessions, feeds, TIMING).items():
            medians[k].append(latency.cpu_median_ms)
    return {k: min(v) for k, v in medians.items()}


def ort_extended(source: Path, destination: Path) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(destination)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])


def formed_counts(path: Path) -> dict[str, int]:
    kinds = Counter(n.op_type for n in onnx.load(path, load_external_data=False).graph.node)
    return {op: kinds[op] for op in QUANTIZED_OPS if kinds[op]}


LEFT_OVER = ("QuantizeLinear", "DequantizeLinear")


def kernels(counts: dict[str, int]) -> dict[str, int]:
    """The quantized kernels among what onnxruntime formed: without the Q/DQ it left. Fewer Q/DQ
    left is no unit split: a DequantizeLinear read only by a Shape stays in onnxruntime's output
    (BERT: one per layer), and goes where fuse rewired that Shape."""
    return {op: n for op, n in counts.items() if op not in LEFT_OVER}


def _formed(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in kernels(counts).items()) or "none"


def _left(counts: dict[str, int]) -> str:
    return " / ".join(str(counts.get(op, 0)) for op in LEFT_OVER)


POLICY = """\
## The decision, per target

- **QDQ models** (QuantizeLinear / DequantizeLinear around each quantized node): fuse forms the
  standard quantized operators itself at `--target onnx` and `ort-cpu` (plain ONNX, opset 10), from whole node
  units with onnxruntime's own preconditions (its QDQ selectors): `qlinear-conv` (DQ(x), DQ(const
  w, per tensor or per output channel), DQ(int32 bias at x_scale * w_scale, zero point 0) -> Conv
  [-> a Relu the Q's zero point makes redundant] -> Q  =>  QLinearConv), `qlinear-matmul` (=>
  QLinearMatMul, either operand computed), and `drop-qdq-pairs` (a DQ/Q pair of one scale around
  Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Expand, Slice, Gather, Tile dropped: exact);
  at `--target ort-cpu` also the com.microsoft kernels onnxruntime forms itself: `qgemm` (a Gemm
  unit => QGemm: no standard quantized Gemm takes a bias, so `--target onnx` leaves that unit),
  `qlinear-binary` (Add, Mul => QLinearAdd, QLinearMul) and `qlinear-global-average-pool`
  (=> QLinearGlobalAveragePool).
  A DequantizeLinear another node reads too stays for it (onnxruntime likewise gives each unit its
  own copy). `--target ort` and `ort-cuda` keep the units (the standard QLinear operators' CUDA
  kernels are not checked). The Softmax unit stays in float at every target: onnxruntime's CPU
  QLinearSoftmax, which its extended level forms, ran 2.0-2.6x the DequantizeLinear -> Softmax ->
  QuantizeLinear it replaces (the last table but one; ops/qlinear_unary.py's measurement), and it
  computes another output scale (it multiplies by floor(1/y_scale): the quantizer's 1/255 gives
  254, a step low near probability 1) and, in u8 over a reduced length of 1, writes the zero point
  instead of 255. Other units (Concat, Sigmoid, AveragePool, LeakyRelu: none in these models)
  stay as the quantizer wrote them, for onnxruntime to form at ORT_ENABLE_EXTENDED:
  eliminate-common-subexpressions merges no Q/DQ pair, fused-conv / fused-gemm / fused-matmul leave
  a unit alone (fused, it ran in float: the last table), and a BatchNormalization inside a unit is
  kept with a reason of its own.
- **Verification** judges an output a DequantizeLinear writes in steps of its scale: within
  `verify.QUANTIZED_OUTPUT_STEPS` (48) steps elementwise. A quantized kernel sums exactly in int32
  and requantizes once, so a unit may land one step from its float DQ -> op -> Q, and steps carry
  through later layers: onnxruntime's own formed kernels move these models' outputs by the same
  1-35 steps as fuse's ("max abs diff" below: fuse's output against the original's, both at
  ORT_DISABLE_ALL, at the dims timed).
  An output downstream of a quantizer also passes within its runtime envelope: what onnxruntime's
  own optimizations (level all) move it by on the same inputs; and one beyond its bounds in at most
  1% of its elements (a rounding flip) is judged again on fresh inputs (README, docs/promises.md).
- **Dynamically quantized models** (MatMulInteger / ConvInteger / DynamicQuantizeLinear): at the
  onnxruntime targets dynamic-quantize-matmul forms DynamicQuantizeMatMul / MatMulIntegerToFloat
  as onnxruntime does, before the attention passes, so that a projection's bias is added in the
  quantized kernel (MultiHeadAttention then takes Q, K and V without one); at `--target onnx`
  those nodes are left alone. The float parts around them (LayerNorm, GELU, attention) fuse as in
  a float model.
- **QOperator models** (QLinearConv ...): left alone (tests/test_quantized.py).
"""


def decision(rows: list[Row]) -> list[str]:
    """The policy, and how the measured rows bear it out."""
    fused = [(row, key, out) for row in rows for key, out in row.outputs.items() if key.startswith("fuse")]
    same = [1 for row, _, out in fused
            if not out.error and kernels(out.formed) == kernels(row.outputs["original"].formed)]
    verified = [1 for _, _, out in fused if out.detail.startswith("match")]
    lines = [POLICY]
    if fused:
        lines.append(f"Measured here: onnxruntime forms the same quantized kernels from fuse's output as from the "
                     f"original for {len(same)} of {len(fused)} (model, target) pairs; verification matched on "
                     f"{len(verified)} of {len(fused)}. Time over the original's, lowest-highest:")
        lines += ["", "| forms | level | fuse onnx | fuse ort-cpu | ort extended |", "|---|---|---|---|---|"]
        for forms, pick in (("QDQ", lambda r: r.form.startswith("qdq")), ("dynamic", lambda r: r.form == "dynamic")):
            for level in LEVELS:
                spans = []
                for key in ("fuse onnx", "fuse ort-cpu", "ort extended"):
                    ratios = [r.outputs[key].latency_ratio[level] for r in rows
                              if pick(r) and key in r.outputs and r.outputs[key].latency_ratio]
                    spans.append(f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-")
                lines.append(f"| {forms} | {level} | " + " | ".join(spans) + " |")
        lines += ["", *remaining_gap(rows)]
    return lines


def remaining_gap(rows: list[Row]) -> list[str]:
    """Per QDQ model: fuse's ort-cpu output against the anchor at both levels (behind: its ratio
    minus the anchor's, where above 0), and the kernels the anchor holds that fuse's own output
    does not (it leaves those units to onnxruntime)."""
    lines = ["Per QDQ model: time over the original's at ORT_DISABLE_ALL and ORT_ENABLE_EXTENDED, fuse's "
             "ort-cpu output behind onnxruntime's offline output by (its ratio minus the anchor's; noise on "
             "this machine is about 0.05), and the kernels the anchor holds that fuse's ort-cpu file does not.", "",
             "| model | fuse onnx (disabled) | fuse ort-cpu (disabled / extended) | ort extended (disabled / extended) "
             "| behind (disabled / extended) | kernels left to onnxruntime (ort-cpu) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        fused, anchor = row.outputs.get("fuse ort-cpu"), row.outputs.get("ort extended")
        if not row.form.startswith("qdq") or anchor is None or fused is None or not fused.latency_ratio:
            continue
        portable = row.outputs.get("fuse onnx")
        portable_ratio = f"{portable.latency_ratio['disabled']:.2f}" if portable and portable.latency_ratio else "-"
        behind = [fused.latency_ratio[level] - anchor.latency_ratio[level] for level in LEVELS]
        left = {op: n - fused.emitted.get(op, 0) for op, n in kernels(row.outputs["original"].formed).items()
                if n > fused.emitted.get(op, 0)}
        lines.append(
            f"| {row.name} | {portable_ratio} | "
            f"{' / '.join(f'{fused.latency_ratio[level]:.2f}' for level in LEVELS)} | "
            f"{' / '.join(f'{anchor.latency_ratio[level]:.2f}' for level in LEVELS)} | "
            f"{' / '.join(f'{b:.2f}' if b >= 0.005 else '-' for b in behind)} | "
            f"{', '.join(f'{op} {n}' for op, n in left.items()) or 'none'} |")
    return lines


def summary_line(row: Row) -> str:
    parts = [f"{k} {o.latency_ratio.get('disabled', float('nan')):.2f}"
             f"/{o.latency_ratio.get('extended', float('nan')):.2f}"
             for k, o in row.outputs.items() if k != "original"]
    same = all(kernels(o.formed) == kernels(row.outputs["original"].formed)
               for k, o in row.outputs.items() if k.startswith("fuse") and not o.error)
    return f"{row.name}: {'same' if same else 'DIFFERENT'} kernels; " + "; ".join(parts)


def markdown(rows: list[Row], unit: list[str] = ()) -> str:
    lines = [f"# Quantized models: fuse and what onnxruntime forms ({datetime.date.today().isoformat()})", "",
             f"onnxruntime {ort.__version__} (CPU provider), one thread. Made by `make quantized-bench` "
             "(benchmarks/quantized_bench.py over benchmarks/corpus/quantized.py's models).", "",
             *decision(rows), "",
             "## Nodes, verification, and what onnxruntime forms at ORT_ENABLE_EXTENDED", "",
             "Formed: the quantized kernels in onnxruntime's offline output; Q / DQ left: the QuantizeLinear / "
             "DequantizeLinear it kept; same: the same kernels, by kind and count, as from the original.", "",
             "| model | form | tool | nodes | fuse: verification; passes | max abs diff "
             "| formed offline (extended) | Q / DQ left | same kernels |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = row.outputs["original"].formed
        for key, out in row.outputs.items():
            if key == "ort extended":
                continue
            same = ("" if key == "original" else "error" if out.error
                    else "yes" if kernels(out.formed) == kernels(base) else "**no**")
            diff = "" if out.max_abs_diff is None else f"{out.max_abs_diff:.2g}"
            lines.append(f"| {row.name} | {row.form} | {key} | {out.nodes} | {out.error or out.detail} | {diff} | "
                         f"{_formed(out.formed)} | {_left(out.formed)} | {same} |")
    lines += ["", "## CPU latency over the original's (below 1: faster)", "",
              "Medians of interleaved rounds, the smaller of two timings. ort extended: onnxruntime's own "
              "extended-level offline output (the best anchor). noise: the original's second session over its "
              "first.", "",
              "| model | dims | original ms (disabled / extended) | fuse onnx | fuse ort-cpu | ort extended | noise |",
              "|---|---|---|---|---|---|---|"]
    for row in rows:
        o = row.outputs["original"]

        def pair(key: str) -> str:
            out = row.outputs.get(key)
            if out is None or not out.latency_ratio:
                return "-"
            return " / ".join(f"{out.latency_ratio[level]:.2f}" for level in LEVELS)

        dims = ", ".join(f"{k}={v}" for k, v in row.dims.items())
        lines.append(f"| {row.name} | {dims} | {o.latency_ms['disabled']:.3f} / {o.latency_ms['extended']:.3f} | "
                     f"{pair('fuse onnx')} | {pair('fuse ort-cpu')} | {pair('ort extended')} | "
                     f"{' / '.join(f'{row.noise[level]:.2f}' for level in LEVELS)} |")
    if unit:
        lines += ["", *unit]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
