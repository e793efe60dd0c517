"""The "LLM" group of `make bench`: fuse --target ort-cpu against the anchors on the decoder corpus.

    .venv/bin/python benchmarks/llm_bench.py --models DIR [--anchor-python PY] [--out benchmarks/results/llm.md]

Models: every file of DIR's manifest.json (benchmarks/corpus/decoders.py: tiny random-init Llama
GQA, Qwen2, Phi-3 and GPT-2, TorchScript opset 17 and dynamo opset 18, prefill and decode step).
Prefill graphs run at batch 1 x sequence 128, decode steps at batch 1, one new token, past 128;
Whisper's (encoder-decoder) at encoder_sequence 1500; attention masks all ones, token ids in the
embedding's range.

Tools, each writing a file from the original:
- `fuse`: fuse_cli.api.optimize, --target ort-cpu, default flags (verification and peak guard on);
- `fuse-onnx23`: the same with --target onnx --upgrade-opset 23 (the standard RMSNormalization,
  RotaryEmbedding and Attention; not compared with the anchors, which target onnxruntime);
- `onnxscript`: onnxscript.rewriter.ort_fusions.optimize_for_ort;
- `ort-transformers`: onnxruntime.transformers.optimizer.optimize_model with model_type "gpt2"
  (GPT-2), "phi" then "gpt2" (Phi-3), "gpt2" (the Llama-style ones: its decoder fusions), its own
  default opt_level, use_gpu False;
- `ort-extended`: onnxruntime's offline optimizer, ORT_ENABLE_EXTENDED on the CPU provider,
  saved through optimized_model_filepath.
The two Python anchors run in `--anchor-python` (default: the corpus virtualenv, which has
onnxscript and onnxruntime's transformers package); where it is missing they are left out, said so.

Per model and tool: top-level nodes, attentions fused (com.microsoft Attention, MultiHeadAttention,
GroupQueryAttention, standard Attention), outputs against the original (max abs difference, both at
ORT_DISABLE_ALL on the same inputs), latency ratio to the original at ORT_DISABLE_ALL and
ORT_ENABLE_ALL (one-thread sessions, fuse_cli.bench.time_sessions: rounds interleaved with the
order rotating, median of the calling thread's CPU time; the whole timing is done twice and the
smaller median kept), measured peak activation memory (fuse_cli.analysis.measure, one child per
model and tool: the allocator's exact high-water mark where memray is installed, else VmHWM) and
session creation time at ORT_ENABLE_ALL (smallest of three). A second session
of the original is timed beside the others: its ratio is the noise floor of that model and level.
No figure of this script is asserted by a test. Shards run side by side (`--only`, one per core, each
with its own `--json`) are rendered as one table with `--from-json A.json B.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from fuse_cli import api
from fuse_cli.analysis.measure import measure_peak
from fuse_cli.bench import Timing, make_session, time_sessions, timed_session
from fuse_cli.config import FuseConfig

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = ("onnxscript", "ort-transformers", "ort-extended")
TOOLS = ("fuse", "fuse-onnx23", *ANCHORS)
ATTENTIONS = {("com.microsoft", "Attention"), ("com.microsoft", "MultiHeadAttention"),
              ("com.microsoft", "GroupQueryAttention"), ("", "Attention")}
PREFILL = {"batch": 1, "sequence": 128}
DECODE = {"batch": 1, "sequence": 1, "past_sequence": 128}
ENCODER = {"encoder_sequence": 1500}  # an encoder-decoder's (Whisper's) encoder output: 30 s of audio
LEVELS = ("disabled", "all")
TIMING = Timing(min_samples=15, max_samples=200, min_seconds=0.6)
QUICK = Timing(warmup_runs=1, warmup_seconds=0.0, min_samples=3, max_samples=3, min_seconds=0.0, sample_seconds=0.0)

# Runs in the anchor Python: tool, source, destination[, model types].
ANCHOR_CHILD = r"""
import json, sys
tool, src, dst = sys.argv[1:4]
if tool == "onnxscript":
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort
    model, counts = optimize_for_ort(ir.load(src))
    ir.save(model, dst)
    print(json.dumps({"detail": ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)}))
else:
    import logging
    logging.disable(logging.WARNING)
    from onnxruntime.transformers.optimizer import optimize_model
    errors = []
    for model_type in sys.argv[4].split(","):
        try:
            optimized = optimize_model(src, model_type=model_type, num_heads=0, hidden_size=0, use_gpu=False)
            optimized.save_model_to_file(dst)
            print(json.dumps({"detail": f"model_type {model_type}" + (f" ({'; '.join(errors)})" if errors else "")}))
            break
        except Exception as exc:
            errors.append(f"{model_type}: {type(exc).__name__}: {str(exc)[:120]}")
    else:
        print(json.dumps({"error": "; ".join(errors)}))
"""


@dataclass
class ToolRow:
    tool: str
    nodes: int | None = None
    attentions: int | None = None
    max_abs_diff: float | None = None
    latency_ratio: dict[str, float] = field(default_factory=dict)  # level -> CPU-time ratio to the original
    latency_ms: dict[str, float] = field(default_factory=dict)
    peak_bytes: int | None = None
    session_ms: float | None = None
    detail: str = ""
    error: str | None = None


@dataclass
class ModelRow:
    name: str
    dims: dict[str, int]
    noise: dict[str, float]  # level -> the original's second session over its first
    tools: list[ToolRow]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / "benchmarks/corpus/decoder-models")
    parser.add_argument("--anchor-python", type=Path, default=ROOT / ".venv-corpus/bin/python")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/llm.md")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", help="a regular expression over model names")
    parser.add_argument("--quick", action="store_true", help="few timing rounds (a smoke run)")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="JSON",
                        help="render --out from the --json files of runs made side by side (shards of one corpus, "
                             "e.g. --only per CPU core) instead of running")
    args = parser.parse_args()
    if args.from_json:
        rows = [row for path in args.from_json for row in rows_from_json(path)]
        args.out.write_text(markdown(sorted(rows, key=lambda r: r.name), quick=False, shards=len(args.from_json)))
        print(args.out.read_text())
        return 0
    manifest = args.models / "manifest.json"
    if not manifest.exists():
        print(f"LLM group: no {manifest} (make bench-corpus builds it); skipped", file=sys.stderr)
        return 0
    files = json.loads(manifest.read_text())["files"]
    anchors = args.anchor_python.exists()
    if not anchors:
        print(f"LLM group: {args.anchor_python} missing: onnxscript and ort-transformers left out", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, entry in sorted(files.items()):
            if entry.get("status") != "exported" or args.only and not re.search(args.only, name):
                continue
            rows.append(bench_model(args.models / name, entry, Path(scratch), args.anchor_python if anchors else None,
                                    QUICK if args.quick else TIMING))
            print(summary_line(rows[-1]), file=sys.stderr, flush=True)
    args.out.write_text(markdown(rows, quick=args.quick))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(args.out.read_text())
    return 0


def rows_from_json(path: Path) -> list[ModelRow]:
    """The rows a run wrote with --json."""
    return [ModelRow(r["name"], r["dims"], r["noise"], [ToolRow(**t) for t in r["tools"]])
            for r in json.loads(path.read_text())]


def bench_model(path: Path, entry: dict, scratch: Path, anchor_python: Path | None, timing: Timing) -> ModelRow:
    dims = dict(DECODE if entry.get("kind") == "decode" else PREFILL)
    if any("encoder_sequence" in i["shape"] for i in entry["inputs"]):
        dims.update(ENCODER)
    dims["past_sequence + sequence"] = dims.get("past_sequence", 0) + dims["sequence"]
    ranges = {i["name"]: tuple(i["range"]) for i in entry["inputs"] if "range" in i and "mask" not in i["name"]}
    outputs: dict[str, Path] = {}
    rows = {tool: ToolRow(tool) for tool in TOOLS}
    for tool in TOOLS:
        destination = scratch / f"{path.stem}.{tool}.onnx"
        try:
            rows[tool].detail = optimize(tool, path, destination, entry, anchor_python)
            outputs[tool] = destination
        except Exception as exc:  # an anchor failing on a model is a result, not a crash
            rows[tool].error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    feeds = inputs_for(path, dims, ranges)
    reference = make_session(str(path)).run(None, feeds)
    for tool, out in list(outputs.items()):
        model = onnx.load(out, load_external_data=False)
        kinds = Counter((n.domain or "", n.op_type) for n in model.graph.node)
        rows[tool].nodes, rows[tool].attentions = len(model.graph.node), sum(kinds[k] for k in ATTENTIONS)
        try:
            got = make_session(str(out)).run(None, feeds_for(out, feeds))
            rows[tool].max_abs_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, got))
        except Exception as exc:
            rows[tool].error = f"does not run: {str(exc).splitlines()[0][:160]}"
            del outputs[tool]
    noise = {}
    for level in LEVELS:
        paths = {"original": path, "original (2nd session)": path, **outputs}
        sessions = {key: make_session(str(p), level=level) for key, p in paths.items()}
        run_feeds = {key: feeds_for(p, feeds) for key, p in paths.items()}
        medians = {key: [] for key in paths}
        for _ in range(2):  # the whole interleaved timing twice: the smaller median of each
            for key, latency in time_sessions(sessions, run_feeds, timing).items():
                medians[key].append(latency.cpu_median_ms)
        best = {key: min(values) for key, values in medians.items()}
        noise[level] = best["original (2nd session)"] / best["original"]
        for tool in outputs:
            rows[tool].latency_ms[level] = best[tool]
            rows[tool].latency_ratio[level] = best[tool] / best["original"]
        rows.setdefault("original", ToolRow("original")).latency_ms[level] = best["original"]
    original = rows["original"]
    original.nodes = len(onnx.load(path, load_external_data=False).graph.node)
    original.attentions = 0
    for key, p in {"original": path, **outputs}.items():
        measured = measure_peak(p, dims=dims, repeats=timing.peak_repeats, int_ranges=ranges)
        # the allocator's exact count where memray is installed: decode-step peaks are sub-MiB,
        # where the resident figure reads hundreds of KiB off
        rows[key].peak_bytes = measured.exact_or_resident_bytes
        rows[key].session_ms = timed_session(p, "CPU", "all", timing.session_repeats)[1]
    return ModelRow(path.stem, {k: v for k, v in dims.items() if "+" not in k}, noise,
                    [original, *(rows[t] for t in TOOLS)])


def optimize(tool: str, source: Path, destination: Path, entry: dict, anchor_python: Path | None) -> str:
    if tool in ("fuse", "fuse-onnx23"):
        config = FuseConfig(target="ort-cpu") if tool == "fuse" else FuseConfig(target="onnx", upgrade_opset=23)
        report = api.optimize(source, config, destination).report
        verdict = report.verification.status if report.verification else "not verified"
        dropped = ", ".join(sorted({d.pass_name for d in report.peak_guard}))
        return f"verification {verdict}" + (f"; peak guard left out {dropped}" if dropped else "")
    if tool == "ort-extended":
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(destination)
        options.log_severity_level = 3
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        return ""
    if anchor_python is None:
        raise RuntimeError("no anchor Python")
    types = {"gpt2": "gpt2", "phi3": "phi,gpt2"}.get(entry.get("model", ""), "gpt2")
    child = subprocess.run([str(anchor_python), "-c", ANCHOR_CHILD, tool, str(source), str(destination), types],
                           capture_output=True, text=True, timeout=600)
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode or not lines:
        raise RuntimeError((child.stderr.strip().splitlines() or ["failed"])[-1])
    reply = json.loads(lines[-1])
    if "error" in reply:
        raise RuntimeError(reply["error"])
    return reply["detail"]


def inputs_for(path: Path, dims: dict[str, int], ranges: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in make_session(str(path)).get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in inp.shape]
        if "mask" in inp.name:
            feeds[inp.name] = np.ones(shape, np.int64)
        elif inp.type == "tensor(int64)":
            low, high = ranges.get(inp.name, (0, 10))
            feeds[inp.name] = rng.integers(low, high, shape).astype(np.int64)
        else:  # the input's own float type: the float16 copies' caches are float16
            dtype = np.float16 if inp.type == "tensor(float16)" else np.float32
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def feeds_for(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The original's inputs a model reads (onnxruntime's saved models may drop or keep some)."""
    return {i.name: feeds[i.name] for i in make_session(str(path)).get_inputs()}


def summary_line(row: ModelRow) -> str:
    parts = [f"{t.tool} {t.latency_ratio.get('disabled', math.nan):.2f}/{t.latency_ratio.get('all', math.nan):.2f}"
             for t in row.tools[1:]]
    return f"{row.name}: noise {row.noise['disabled']:.2f}/{row.noise['all']:.2f}; " + "; ".join(parts)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / 2**20:.2f}"


def markdown(rows: list[ModelRow], *, quick: bool, shards: int = 1) -> str:
    lines = ["# LLM group: fuse --target ort-cpu against the anchors on the decoder corpus", "",
             f"benchmarks/llm_bench.py, one run{' (--quick: not worth comparing)' if quick else ''}"
             f"{f' in {shards} shards side by side, one per core' if shards > 1 else ''}; onnxruntime "
             f"{ort.__version__} CPU, one thread. Latency: CPU time of the calling thread, median of interleaved "
             "rounds, the smaller of two timings, over the original at the same level (below 1: faster). `noise`: the "
             "original's second session over its first. Peak: measured activation peak (MiB, ORT_DISABLE_ALL, arena "
             "off; the allocator's exact high-water mark, memray). Session: creation at ORT_ENABLE_ALL (ms). attn: "
             "attention operators in the output.", "",
             "| model | tool | nodes | attn | max abs diff | disabled | all | peak MiB | peak ratio "
             "| session ms | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = row.tools[0]
        for t in row.tools:
            if t.tool == "original":
                latency = f"{base.latency_ms.get('disabled', 0):.2f} ms", f"{base.latency_ms.get('all', 0):.2f} ms"
                note = f"noise {row.noise['disabled']:.2f} / {row.noise['all']:.2f}; " + ", ".join(
                    f"{k} {v}" for k, v in row.dims.items())
            else:
                latency = _ratio(t.latency_ratio.get("disabled")), _ratio(t.latency_ratio.get("all"))
                note = t.error or t.detail
            peak_ratio = (t.peak_bytes / base.peak_bytes if t.peak_bytes is not None and base.peak_bytes else None)
            diff = "" if t.max_abs_diff is None else f"{t.max_abs_diff:.1e}"
            lines.append(f"| {row.name if t.tool == 'original' else ''} | {t.tool} "
                         f"| {t.nodes if t.nodes is not None else ''} "
                         f"| {t.attentions if t.attentions is not None else ''} | {diff} | {latency[0]} | {latency[1]} "
                         f"| {_mib(t.peak_bytes)} | {_ratio(peak_ratio)} | "
                         f"{'' if t.session_ms is None else f'{t.session_ms:.0f}'} | {note} |")
    lines += ["", "## Geometric means over the models each tool ran", "",
              "| tool | models | disabled | all | peak ratio | nodes ratio |", "|---|---|---|---|---|---|"]
    for tool in TOOLS:
        ran = [(r.tools[0], t) for r in rows for t in r.tools if t.tool == tool and t.latency_ratio]
        if not ran:
            continue
        def geo(values):
            return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan

        lines.append(f"| {tool} | {len(ran)} | {geo([t.latency_ratio['disabled'] for _, t in ran]):.3f} | "
                     f"{geo([t.latency_ratio['all'] for _, t in ran]):.3f} | "
                     f"{geo([t.peak_bytes / b.peak_bytes for b, t in ran if t.peak_bytes and b.peak_bytes]):.3f} | "
                     f"{geo([t.nodes / b.nodes for b, t in ran]):.3f} |")
    noise = [abs(math.log(r.noise[level])) for r in rows for level in LEVELS]
    if noise:
        lines += ["", f"Noise floor: the original's second session differs from its first by "
                      f"{100 * (math.exp(statistics.median(noise)) - 1):.1f}% (median) and "
                      f"{100 * (math.exp(max(noise)) - 1):.1f}% (largest) over models and levels."]
    lines += ["", "## Where an anchor is ahead of fuse", "",
              "Latency beyond the model's noise at that level, or a measured peak more than 2% and 64 KiB lower, "
              "or more attentions fused (reasons: benchmarks/results/llm_notes.md).", ""]
    ahead = [line for row in rows for line in _ahead(row)]
    lines += ahead or ["None."]
    return "\n".join(lines) + "\n"


def _ahead(row: ModelRow) -> list[str]:
    tools = {t.tool: t for t in row.tools}
    fuse, out = tools["fuse"], []
    if not fuse.latency_ratio:
        return [f"- {row.name}: fuse produced no model ({fuse.error})"]
    for tool in ANCHORS:
        t = tools[tool]
        if not t.latency_ratio:
            continue
        for level in LEVELS:
            margin = abs(row.noise[level] - 1)
            if t.latency_ratio[level] < fuse.latency_ratio[level] - margin:
                out.append(f"- {row.name}, {level}: {tool} {t.latency_ratio[level]:.2f} vs fuse "
                           f"{fuse.latency_ratio[level]:.2f} (noise {margin:.2f})")
        if (t.peak_bytes is not None and fuse.peak_bytes is not None
                and t.peak_bytes < fuse.peak_bytes - max(2**16, 0.02 * fuse.peak_bytes)):
            out.append(f"- {row.name}, peak: {tool} {_mib(t.peak_bytes)} MiB vs fuse {_mib(fuse.peak_bytes)} MiB")
        if (t.attentions or 0) > (fuse.attentions or 0):
            out.append(f"- {row.name}, attentions: {tool} {t.attentions} vs fuse {fuse.attentions}")
    return out


if __name__ == "__main__":
    sys.exit(main())
