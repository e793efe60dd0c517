"""fuse --target ort / ort-cpu against onnxruntime's own transformers optimizer
(`python -m onnxruntime.transformers.optimizer`, model_type "bert") on transformer models.

    .venv/bin/python benchmarks/vs_transformers_optimizer.py                 # all models, ~5-8 minutes
    .venv/bin/python benchmarks/vs_transformers_optimizer.py --quick         # few iterations (smoke run)
    .venv/bin/python benchmarks/vs_transformers_optimizer.py --models 'sample-*,bert-mini-opset14'

Models (`--models` takes names or shell patterns, comma-separated):

- `sample-opset14`, `sample-opset17`: sample_models/transformer_block_opset{14,17}.onnx (one
  post-LN block: attention without a mask, LayerNorm, Erf GELU MLP; hidden 64, 4 heads).
- `bert-attn-opset14`, `bert-attn-opset17`: the BERT-form self-attention of the test suite
  (tests/attention_graphs.py `bert(opset, padding=True)`: Q/K/V projections, additive padding mask
  from an int64 attention_mask, Softmax, no LayerNorm or GELU; hidden 64, 4 heads).
- `bert-mini-opset14`, `bert-mini-opset17`: a 2-layer BERT built here node by node the way
  torch.onnx.export (TorchScript) writes transformers' BertModel: word + position + token-type
  embeddings (position and token-type ids sliced from buffers at run time), LayerNorm decomposed at
  opset 14 and one LayerNormalization at 17, head-split shapes computed from Shape, the additive
  mask of transformers 4.21-4.35, (1 - mask[:, None, None, :]) * finfo(float32).min (two
  Unsqueezes, as torch writes the indexing), Erf GELU; hidden 64, 4 heads, FFN 256, vocab 1000.
- `bert-base-opset14`, `bert-base-opset17`, `bert-base-dynamo`: the real exports of
  benchmarks/corpus (`make bench-corpus`; 12 layers, hidden 768, 12 heads, vocab 30522), skipped
  with a note when that folder has no such file.

Tools, each run once per model in a child process of its own (file in, file out; its time excludes
imports): `fuse --target ort` and `fuse --target ort-cpu` (fuse_cli.api.optimize with the default
pipeline, its own output check included; where that check rolls passes back, the same again with
verify=False, as `... --no-verify` rows, whose outputs this script's own check judges), and
`ort-transformers`: onnxruntime.transformers.optimizer.optimize_model(model_type="bert",
num_heads, hidden_size, opt_level=1 (its default for BERT: onnxruntime's basic offline
optimizations, then its Python fusions; --ort-opt-level 0 for the Python fusions alone),
use_gpu=False), saved with save_model_to_file. Its child runs in a temporary working directory (it writes temporary
files). With opt_level >= 1 it imports torch only to read `torch.version.hip` on the use_gpu path;
where torch is not installed the child gives it a stub module with no other effect.

Measurements, per model, on the same seeded inputs (batch 1, sequence 128; input_ids uniform in
0..vocab-1; attention_mask ones then zeros, a valid length drawn in [sequence/2, sequence];
token_type_ids zeros; float inputs standard normal):

- node counts (top-level nodes) and the op types left that mark an unfused subgraph: ReduceMean,
  Pow, Sqrt (LayerNorm), Erf, Tanh (GELU), Softmax (attention); and the fused operators made.
- output difference against the original, both run with graph optimizations disabled on the CPU
  provider: max abs difference, and whether every element is within the project's fp32 tolerance
  (rtol 1e-4, atol 1e-5 scaled by the output's magnitude: fuse_cli.verify.compare_outputs).
- latency on onnxruntime's CPU provider, one intra-op and one inter-op thread, graph optimizations
  disabled (the graph as written) and ORT_ENABLE_ALL (onnxruntime's default): all sessions of a
  model at one level are warmed up and then timed in alternating rounds with the order rotating
  (fuse_cli.bench.time_sessions), median per run of the calling thread's CPU time
  (time.thread_time) and of wall time. With one thread onnxruntime runs every kernel on the calling
  thread, so CPU time is the work the model did and other load on the machine hardly moves it;
  trust it over wall time. A second session of the original ("original (2nd session)") is timed
  beside them: its ratio to the original is the noise floor.

Writes benchmarks/results/vs_transformers_optimizer.md (or --out), and --json PATH when given.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fnmatch
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

CORPUS = REPO / "benchmarks" / "corpus" / "models"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "vs_transformers_optimizer.md"
RESULT_MARK = "RESULT "
OPTIMIZE_TIMEOUT_S = 600
SEED = 0
BATCH, SEQUENCE = 1, 128
ORT_TX_OPT_LEVEL = 1  # optimize_model's default for model_type "bert"

# op types whose presence means a subgraph was left decomposed
UNFUSED = {"ReduceMean": "LayerNorm", "Pow": "LayerNorm", "Sqrt": "LayerNorm",
           "Erf": "GELU", "Tanh": "GELU", "Softmax": "attention"}
# standard-domain operators that are themselves fusions (everything in com.microsoft counts too)
FUSED_STANDARD = {"LayerNormalization", "RMSNormalization", "Gelu", "Attention"}

TOOLS = ("fuse-ort", "fuse-ort-cpu", "ort-transformers")
# run only when fuse's own output check rolled passes back (see bench_model)
NO_VERIFY = {"fuse-ort": "fuse-ort-noverify", "fuse-ort-cpu": "fuse-ort-cpu-noverify"}
TOOL_LABELS = {"original": "original", "fuse-ort": "fuse --target ort", "fuse-ort-cpu": "fuse --target ort-cpu",
               "ort-transformers": "ORT transformers optimizer", "noise": "original (2nd session)",
               "fuse-ort-noverify": "fuse --target ort --no-verify",
               "fuse-ort-cpu-noverify": "fuse --target ort-cpu --no-verify"}
LEVELS = ("disabled", "all")


# ---- models ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    heads: int
    hidden: int
    vocab: int | None  # input_ids range, for models with token inputs
    path: Path | None = None  # a file, or None when `build` makes it
    build: Callable[[], onnx.ModelProto] | None = None


def _attention_model(opset: int) -> onnx.ModelProto:
    from tests.attention_graphs import bert

    return bert(opset, padding=True)


def bert_mini(opset: int, *, layers: int = 2, hidden: int = 64, heads: int = 4, ffn: int = 256, vocab: int = 1000,
              max_positions: int = 512, eps: float = 1e-12, seed: int = 11) -> onnx.ModelProto:
    """A small BertModel (no pooler) in the form torch.onnx.export(dynamo=False) writes it."""
    from tests.graphs import GraphBuilder

    b = GraphBuilder(opset=opset, seed=seed)
    head_size = hidden // heads

    def w(*shape: int, std: float = 0.02) -> str:
        return b.const(b.rng.normal(0.0, std, shape).astype(np.float32))

    def f(value) -> str:
        return b.const(np.asarray(value, np.float32))

    def i64(values) -> str:
        return b.const(np.asarray(values, np.int64))

    def layer_norm(x: str, name: str) -> str:
        gamma = b.const((1.0 + b.rng.normal(0.0, 0.05, hidden)).astype(np.float32), name=f"{name}.weight")
        beta = b.const(b.rng.normal(0.0, 0.05, hidden).astype(np.float32), name=f"{name}.bias")
        if opset >= 17:
            return b.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps, name=name)
        mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name=f"{name}_mean")
        d = b.op("Sub", x, mean)
        var = b.op("ReduceMean", b.op("Pow", d, f(2.0)), axes=[-1], keepdims=1)
        std = b.op("Sqrt", b.op("Add", var, f(eps)))
        return b.op("Add", b.op("Mul", b.op("Div", d, std), gamma), beta, name=f"{name}_out")

    def linear(x: str, n_in: int, n_out: int, name: str) -> str:
        product = b.op("MatMul", x, w(n_in, n_out), name=f"{name}_matmul")
        return b.op("Add", w(n_out), product, name=f"{name}_add")  # torch: bias first

    def leading(t: str, count: int) -> str:  # x.size()[:count], at run time
        return b.op("Slice", b.op("Shape", t), i64([0]), i64([count]), i64([0]))

    ids = b.input("input_ids", ["batch", "sequence"], onnx.TensorProto.INT64)
    mask = b.input("attention_mask", ["batch", "sequence"], onnx.TensorProto.INT64)

    # embeddings: position_ids / token_type_ids buffers sliced to the input's length
    length = b.op("Unsqueeze", b.op("Gather", b.op("Shape", ids), i64(1), axis=0), i64([0]))
    positions = b.op("Slice", b.const(np.arange(max_positions, dtype=np.int64)[None, :], name="position_ids"),
                     i64([0]), length, i64([1]))
    token_types = b.op("Expand", b.op("Slice", b.const(np.zeros((1, max_positions), np.int64), name="token_type_ids"),
                                      i64([0]), length, i64([1])), b.op("Shape", ids))
    x = b.op("Gather", w(vocab, hidden), ids, name="word_embeddings")
    x = b.op("Add", x, b.op("Gather", w(2, hidden), token_types, name="token_type_embeddings"))
    x = b.op("Add", x, b.op("Gather", w(max_positions, hidden), positions, name="position_embeddings"))
    x = layer_norm(x, "embeddings.LayerNorm")

    # extended attention mask: (1 - mask[:, None, None, :]) * finfo(float32).min
    # (torch writes mask[:, None, None, :] as two Unsqueezes)
    ext = b.op("Cast", b.op("Unsqueeze", b.op("Unsqueeze", mask, i64([1])), i64([2])), to=onnx.TensorProto.FLOAT)
    ext = b.op("Mul", b.op("Sub", f(1.0), ext), f(np.finfo(np.float32).min), name="extended_mask")

    for layer in range(layers):
        p = f"layer{layer}"
        split = b.op("Concat", leading(x, 2), i64([heads, head_size]), axis=0)

        def heads_of(t: str, perm: list[int], name: str) -> str:
            return b.op("Transpose", b.op("Reshape", t, split), perm=perm, name=name)  # noqa: B023

        q = heads_of(linear(x, hidden, hidden, f"{p}.query"), [0, 2, 1, 3], f"{p}.q_transpose")
        k = heads_of(linear(x, hidden, hidden, f"{p}.key"), [0, 2, 3, 1], f"{p}.k_transpose")
        v = heads_of(linear(x, hidden, hidden, f"{p}.value"), [0, 2, 1, 3], f"{p}.v_transpose")
        scores = b.op("Div", b.op("MatMul", q, k), f(np.sqrt(head_size)))
        scores = b.op("Add", scores, ext)
        probs = b.op("Softmax", scores, axis=3 if opset < 17 else -1, name=f"{p}.softmax")
        context = b.op("Transpose", b.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        merged = b.op("Concat", leading(context, 2), i64([hidden]), axis=0)
        context = b.op("Reshape", context, merged)
        attn = linear(context, hidden, hidden, f"{p}.attention.output")
        x = layer_norm(b.op("Add", attn, x), f"{p}.attention.output.LayerNorm")

        h = linear(x, hidden, ffn, f"{p}.intermediate")
        gelu = b.op("Mul", b.op("Mul", h, b.op("Add", b.op("Erf", b.op("Div", h, f(np.sqrt(2.0)))), f(1.0))), f(0.5))
        out = linear(gelu, ffn, hidden, f"{p}.output")
        x = layer_norm(b.op("Add", out, x), f"{p}.output.LayerNorm")

    model = b.build(x, output_names=["last_hidden_state"])
    model.producer_name = "pytorch"  # what the ORT optimizer expects for model_type "bert"
    return model


def model_specs() -> list[ModelSpec]:
    specs = [
        ModelSpec(f"sample-opset{o}", f"sample_models/transformer_block_opset{o}.onnx", 4, 64, None,
                  path=REPO / "sample_models" / f"transformer_block_opset{o}.onnx") for o in (14, 17)]
    specs += [ModelSpec(f"bert-attn-opset{o}", f"tests/attention_graphs.py bert({o}, padding=True)", 4, 64, None,
                        build=lambda o=o: _attention_model(o)) for o in (14, 17)]
    specs += [ModelSpec(f"bert-mini-opset{o}", f"2-layer BertModel-form stack built here (opset {o})", 4, 64, 1000,
                        build=lambda o=o: bert_mini(o)) for o in (14, 17)]
    specs += [ModelSpec(f"bert-base-{form}", f"benchmarks/corpus/models/bert-base-{form}.onnx", 12, 768, 30522,
                        path=CORPUS / f"bert-base-{form}.onnx") for form in ("opset14", "opset17", "dynamo")]
    return specs


# ---- optimizers, each in a child process -------------------------------------------------------

def optimize_here(tool: str, source: str, destination: str, heads: int, hidden: int, opt_level: int) -> dict[str, Any]:
    """Run one optimizer, file to file; the time excludes imports."""
    info: dict[str, Any] = {}
    if tool in ("fuse-ort", "fuse-ort-cpu", *NO_VERIFY.values()):
        from fuse_cli import api
        from fuse_cli.config import FuseConfig

        config = FuseConfig(target="ort-cpu" if tool.startswith("fuse-ort-cpu") else "ort",
                            dims={"batch": BATCH, "sequence": SEQUENCE}, verify=not tool.endswith("-noverify"))
        start = time.perf_counter()
        result = api.optimize(source, config, destination)
        seconds = time.perf_counter() - start
        report = result.report
        info["rolled_back"] = [str(getattr(r, "pass_name", r)) for r in report.rolled_back]
        info["notes"] = list(report.notes)
        info["near_misses"] = sorted({f"{m.pass_name}: {m.reason}" for m in report.near_misses})[:20]
        if report.verification is not None:
            info["verified"] = bool(report.verification.passed)
    elif tool == "ort-transformers":
        try:
            import torch  # noqa: F401
        except ImportError:  # read only as torch.version.hip, on the use_gpu path (see the docstring)
            stub = types.ModuleType("torch")
            stub.version = types.SimpleNamespace(hip=None, cuda=None)  # type: ignore[attr-defined]
            sys.modules["torch"] = stub
            info["torch_stub"] = True
        import logging

        from onnxruntime.transformers.optimizer import optimize_model

        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        start = time.perf_counter()
        model = optimize_model(source, model_type="bert", num_heads=heads, hidden_size=hidden,
                               opt_level=opt_level, use_gpu=False)
        model.save_model_to_file(destination, use_external_data_format=False)
        seconds = time.perf_counter() - start
        info["fused_operator_statistics"] = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    else:
        raise ValueError(f"unknown tool {tool!r}")
    info["seconds"] = seconds
    return info


def optimize_in_child(tool: str, source: Path, destination: Path, spec: ModelSpec, opt_level: int) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", tool, str(source.resolve()),
               str(destination.resolve()), str(spec.heads), str(spec.hidden), str(opt_level)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory(prefix="vs-ortx-cwd-") as cwd:
        try:
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=OPTIMIZE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"ran past {OPTIMIZE_TIMEOUT_S} s"}
        left_behind = sorted(os.listdir(cwd))
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            info = json.loads(line[len(RESULT_MARK):])
            if left_behind:
                info["wrote_in_cwd"] = left_behind
            return info
    tail = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()][-1:] or ["no output"]
    return {"error": f"exit {done.returncode}: {tail[0][:300]}"}


def child_main(argv: Sequence[str]) -> int:
    tool, source, destination, heads, hidden, opt_level = argv
    try:
        info = optimize_here(tool, source, destination, int(heads), int(hidden), int(opt_level))
    except Exception as exc:  # reported as the cell's error
        info = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"}
    print(RESULT_MARK + json.dumps(info), flush=True)
    return 0


# ---- inputs, outputs, latency ------------------------------------------------------------------

def make_feeds(session, vocab: int | None, seed: int = SEED) -> dict[str, np.ndarray]:
    from fuse_cli.core.feeds import numpy_dtype

    rng = np.random.default_rng(seed)
    dims = {"batch": BATCH, "sequence": SEQUENCE}
    feeds = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else dims.get(d, 1) if isinstance(d, str) else 1 for d in inp.shape]
        dtype = numpy_dtype(inp.type)
        name = inp.name.lower()
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif "input_ids" in name:
            feeds[inp.name] = rng.integers(0, vocab or 2, shape).astype(dtype)
        elif "mask" in name:  # right padding: ones, then zeros
            value = np.zeros(shape, dtype)
            rows = value.reshape(-1, shape[-1])
            for row in rows:
                row[:rng.integers(max(1, shape[-1] // 2), shape[-1] + 1)] = 1
            feeds[inp.name] = rows.reshape(shape)
        elif "token_type" in name:
            feeds[inp.name] = np.zeros(shape, dtype)
        else:
            feeds[inp.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def fused_ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node
                   if n.domain == "com.microsoft" or (n.domain in ("", "ai.onnx") and n.op_type in FUSED_STANDARD))


@dataclass
class ToolResult:
    tool: str
    nodes: int | None = None
    unfused: dict[str, int] = field(default_factory=dict)
    fused: dict[str, int] = field(default_factory=dict)
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    matches: bool | None = None
    optimize_seconds: float | None = None
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # level -> figures
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelResult:
    name: str
    description: str
    heads: int
    hidden: int
    inputs: dict[str, list[int]]
    tools: list[ToolResult]
    timing: dict[str, Any]
    skipped: str | None = None


def timing_for(per_run_s: float, quick: bool):
    from fuse_cli.bench import QUICK, Timing

    if quick:
        return QUICK
    if per_run_s > 0.02:  # bert-base: a run takes a large fraction of a second
        return Timing(warmup_runs=2, warmup_seconds=0.0, min_samples=11, max_samples=11, min_seconds=0.0,
                      sample_seconds=0.0, session_repeats=1, peak_repeats=1)
    return Timing(warmup_runs=5, warmup_seconds=0.3, min_samples=25, max_samples=400, min_seconds=1.5,
                  sample_seconds=0.01, session_repeats=1, peak_repeats=1)


def bench_model(spec: ModelSpec, workdir: Path, quick: bool, opt_level: int, log: Callable[[str], None]) -> ModelResult:
    from fuse_cli.bench import make_session, time_sessions
    from fuse_cli.verify import compare_outputs, run as run_session

    if spec.path is not None:
        if not spec.path.is_file():
            return ModelResult(spec.name, spec.description, spec.heads, spec.hidden, {}, [], {},
                               skipped=f"{spec.path.relative_to(REPO)} is absent (make bench-corpus exports it)")
        source = spec.path
    else:
        source = workdir / f"{spec.name}.onnx"
        onnx.save(spec.build(), str(source))

    results = {"original": ToolResult("original")}
    original = onnx.load(str(source), load_external_data=False)
    results["original"].nodes = len(original.graph.node)
    results["original"].unfused = {op: n for op, n in op_counts(original).items() if op in UNFUSED}
    results["original"].fused = dict(fused_ops(original))
    del original
    paths = {"original": source}
    tools = list(TOOLS)
    for tool in tools:
        log(f"  {spec.name}: {tool} ...")
        destination = workdir / f"{spec.name}.{tool}.onnx"
        info = optimize_in_child(tool, source, destination, spec, opt_level)
        r = results[tool] = ToolResult(tool, optimize_seconds=info.pop("seconds", None), error=info.pop("error", None),
                                       info=info)
        if r.error is None and destination.is_file():
            model = onnx.load(str(destination), load_external_data=False)
            r.nodes = len(model.graph.node)
            r.unfused = {op: n for op, n in op_counts(model).items() if op in UNFUSED}
            r.fused = dict(fused_ops(model))
            paths[tool] = destination
        elif r.error is None:
            r.error = "no output file"
        if tool in NO_VERIFY and r.info.get("rolled_back"):
            # fuse's own check (random inputs, integers in 0..9) rolled passes back: also run it
            # without the check, and let this script's check (valid inputs) judge the output
            tools.insert(tools.index(tool) + 1, NO_VERIFY[tool])

    # outputs, graph optimizations off
    base = make_session(source, "CPU", "disabled")
    feeds = make_feeds(base, spec.vocab)
    want = run_session(base, feeds)
    if any(r.info.get("rolled_back") for r in results.values()):
        # what fuse's own check saw: its seeded random inputs (integers in 0..9) on the original
        from fuse_cli.verify import random_inputs

        seen = run_session(base, random_inputs(base, dims={"batch": BATCH, "sequence": SEQUENCE}, seed=0))
        results["original"].info["nonfinite_on_fuse_check_inputs"] = {
            name: int(np.size(v) - np.isfinite(v).sum()) for name, v in seen.items()
            if np.issubdtype(np.asarray(v).dtype, np.floating) and not np.isfinite(v).all()}
    del base
    for tool, path in paths.items():
        if tool == "original":
            continue
        r = results[tool]
        try:
            session = make_session(path, "CPU", "disabled")
            got = run_session(session, {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})
            del session
            compared = compare_outputs(want, got)
            r.max_abs_diff = max(o.max_abs_diff for o in compared.outputs)
            r.max_rel_diff = max(o.max_rel_diff for o in compared.outputs)
            r.matches = compared.passed
        except Exception as exc:  # a model onnxruntime cannot load or run
            r.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            paths.pop(tool)

    # latency: all sessions of one level timed together, in alternating rounds
    timing_used: dict[str, Any] = {}
    for level in LEVELS:
        log(f"  {spec.name}: latency, graph optimizations {level} ...")
        sessions = {}
        for tool, path in paths.items():
            try:
                sessions[tool] = make_session(path, "CPU", level)
            except Exception as exc:
                results[tool].error = f"{level}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        if "original" in sessions:
            sessions["noise"] = make_session(source, "CPU", level)
        start = time.perf_counter()
        sessions["original"].run(None, feeds)
        timing = timing_for(time.perf_counter() - start, quick)
        timing_used[level] = asdict(timing)
        per_session_feeds = {name: {k: v for k, v in feeds.items() if k in {i.name for i in s.get_inputs()}}
                             for name, s in sessions.items()}
        latencies = time_sessions(sessions, per_session_feeds, timing)
        del sessions
        results.setdefault("noise", ToolResult("noise", nodes=results["original"].nodes))
        for name, lat in latencies.items():
            results[name].latency[level] = {
                "cpu_median_ms": lat.cpu_median_ms, "cpu_p90_ms": lat.cpu_p90_ms,
                "wall_median_ms": lat.wall_median_ms, "wall_p90_ms": lat.wall_p90_ms,
                "samples": lat.samples, "runs_per_sample": lat.runs_per_sample}
    order = ["original", "noise", *tools]
    inputs = {k: list(v.shape) for k, v in feeds.items()}
    return ModelResult(spec.name, spec.description, spec.heads, spec.hidden, inputs,
                       [results[n] for n in order if n in results], timing_used)


# ---- rendering ---------------------------------------------------------------------------------

HEADERS = ("Tool", "Nodes", "Unfused ops left", "Fused ops", "Max abs diff", "Within rtol 1e-4",
           "CPU ms, opt off (×)", "CPU ms, ORT_ENABLE_ALL (×)", "Wall ms, off / all", "Optimize s")


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _unfused(counts: Mapping[str, int]) -> str:
    if not counts:
        return "none"
    groups: dict[str, list[str]] = {}
    for op, n in counts.items():
        groups.setdefault(UNFUSED[op], []).append(f"{op} {n}")
    return "; ".join(f"{g}: {', '.join(v)}" for g, v in groups.items())


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def _latency_cell(r: ToolResult, base: ToolResult, level: str) -> str:
    mine, ref = r.latency.get(level), base.latency.get(level)
    if not mine:
        return "-"
    text = _ms(mine["cpu_median_ms"])
    if ref and r.tool != "original":
        text += f" ({mine['cpu_median_ms'] / ref['cpu_median_ms']:.2f}×)"
    return text


def table_rows(m: ModelResult) -> list[tuple[str, ...]]:
    base = m.tools[0]
    rows = []
    for r in m.tools:
        wall = " / ".join(_ms(r.latency.get(level, {}).get("wall_median_ms")) for level in LEVELS)
        if r.tool == "original":
            diff, match = "", ""
        elif r.tool == "noise":
            diff, match = "", ""
        else:
            diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.2e}"
            match = "-" if r.matches is None else "yes" if r.matches else "NO"
        nodes = "-" if r.nodes is None else str(r.nodes)
        unfused = "" if r.tool == "noise" else _unfused(r.unfused)
        fused = "" if r.tool == "noise" else _counts(r.fused)
        if r.error:
            fused = f"error: {r.error}"
        rows.append((TOOL_LABELS[r.tool], nodes if r.tool != "noise" else "", unfused, fused, diff, match,
                     _latency_cell(r, base, "disabled"), _latency_cell(r, base, "all"), wall,
                     "" if r.optimize_seconds is None else f"{r.optimize_seconds:.1f}"))
    return rows


def model_notes(m: ModelResult) -> list[str]:
    """Facts worth a line: what one tool fused that the other did not, rollbacks, mismatches."""
    by = {r.tool: r for r in m.tools}
    notes = []
    # fuse as it fuses when its own check does not get in the way (see the rollback note)
    fuse_ort = by.get("fuse-ort-noverify") or by.get("fuse-ort")
    ortx = by.get("ort-transformers")
    if fuse_ort and ortx and fuse_ort.error is None and ortx.error is None:
        fuse_label = TOOL_LABELS[fuse_ort.tool]
        only_fuse = sorted(set(fuse_ort.fused) - set(ortx.fused))
        only_ortx = sorted(set(ortx.fused) - set(fuse_ort.fused))
        if only_fuse:
            notes.append(f"only {fuse_label} makes {', '.join(only_fuse)}")
        if only_ortx:
            notes.append(f"only the ORT transformers optimizer makes {', '.join(only_ortx)}")
        for label, r in ((fuse_label, fuse_ort), ("the ORT transformers optimizer", ortx)):
            if r.unfused:
                notes.append(f"{label} leaves {_unfused(r.unfused)}")
        original = by["original"]
        if "Softmax" in ortx.unfused and not ({"ReduceMean", "LayerNormalization"} & (set(original.unfused)
                                                                                       | set(original.fused))):
            notes.append("the ORT transformers optimizer looks for attention only above a LayerNormalization or "
                         "SkipLayerNormalization (the residual Add + LayerNorm that ends a BERT block: "
                         "fusion_attention.FusionAttention.fuse); this graph has no LayerNorm")
    nonfinite = by["original"].info.get("nonfinite_on_fuse_check_inputs") if "original" in by else None
    for r in m.tools:
        if r.info.get("rolled_back"):
            passes = r.info["rolled_back"]
            text = (f"{TOOL_LABELS[r.tool]}: its own output check failed and it rolled back {len(passes)} passes "
                    f"({', '.join(passes[:4])}{', ...' if len(passes) > 4 else ''})")
            if nonfinite:
                text += (f"; on that check's inputs (seeded random integers in 0..9 for every int64 input, "
                         f"attention_mask included) the original itself outputs non-finite values "
                         f"({', '.join(f'{k}: {v}' for k, v in nonfinite.items())} elements), so no rewrite can pass")
            notes.append(text)
        if r.matches is False:
            notes.append(f"{TOOL_LABELS[r.tool]}'s outputs differ from the original beyond rtol 1e-4 "
                         f"(max abs {r.max_abs_diff:.2e}, max rel {r.max_rel_diff:.2e})")
        if r.info.get("wrote_in_cwd"):
            notes.append(f"{TOOL_LABELS[r.tool]} left files in its working directory: "
                         f"{', '.join(r.info['wrote_in_cwd'])}")
    return notes


def settings_lines(run: Mapping[str, Any]) -> list[str]:
    return [
        f"Run {run['date']} on {run['cpu']} ({run['cpus']} CPUs), Python {run['python']}, onnx {run['onnx']}, "
        f"onnxruntime {run['onnxruntime']}, fuse {run['fuse']}; load average {run['load_before']} before, "
        f"{run['load_after']} after; {run['seconds']} s in all" + (" (--quick: figures not worth comparing)"
                                                                   if run["quick"] else "") + ".",
        f"Inputs: batch {BATCH}, sequence {SEQUENCE}, seed {SEED}: input_ids uniform in 0..vocab-1, attention_mask "
        "ones then zeros (valid length drawn in [sequence/2, sequence]), token_type_ids zeros, floats standard normal.",
        "Tools: fuse_cli.api.optimize with FuseConfig(target=\"ort\" / \"ort-cpu\") (its default pipeline, its own "
        "output check included in the time); onnxruntime.transformers.optimizer.optimize_model(model_type=\"bert\", "
        f"num_heads, hidden_size as listed, opt_level={run['ort_opt_level']}, use_gpu=False). Each in a child process "
        "of its own, file to file, imports excluded from the time."
        + (" torch is not installed: the ORT optimizer's child got a stub `torch` module (it reads only "
           "torch.version.hip, and only when use_gpu=True)." if run.get("torch_stub") else ""),
        "Unfused ops left: top-level nodes of the op types that mark a decomposed LayerNorm (ReduceMean, Pow, Sqrt), "
        "GELU (Erf, Tanh) or attention (Softmax). Fused ops: com.microsoft operators and LayerNormalization / Gelu.",
        "Max abs diff: against the original on the same inputs, both on the CPU provider with graph optimizations "
        "disabled, the largest over all outputs; 'within rtol 1e-4': every element within rtol 1e-4 and atol 1e-5 "
        "scaled by the output's magnitude (fuse_cli.verify.compare_outputs).",
        "Latency: onnxruntime CPU provider, one intra-op and one inter-op thread, graph optimizations disabled (the "
        "graph as written) and ORT_ENABLE_ALL; all sessions of a model at one level warmed up, then timed in "
        "alternating rounds with the order rotating (fuse_cli.bench.time_sessions); median per run of the calling "
        "thread's CPU time (time.thread_time), and of wall time. (×) is the ratio to the original at the same level. "
        "Trust CPU time: with one thread onnxruntime runs every kernel on the calling thread, so other load on the "
        "machine hardly moves it, while it moves wall time a lot. 'original (2nd session)' is the original timed "
        "again beside itself: its ratio is the noise floor.",
    ]


def render_markdown(run: Mapping[str, Any], models: Sequence[ModelResult]) -> str:
    out = ["# fuse vs onnxruntime's transformers optimizer", "",
           "Written by `benchmarks/vs_transformers_optimizer.py` (see its docstring). One run, all figures from it.",
           ""]
    out += [f"- {line}" for line in settings_lines(run)] + [""]
    ran = [m for m in models if not m.skipped]
    if ran:
        out += ["## Summary", "",
                "Nodes and median CPU ms per run (graph optimizations disabled / ORT_ENABLE_ALL). A figure in "
                "brackets marked no-verify is fuse with its own output check off, run only where that check "
                "rolled passes back (the model's notes say why).", "",
                "| Model | Nodes: original / fuse ort / fuse ort-cpu / ORT opt | Unfused left: fuse ort "
                "| Unfused left: ORT opt | CPU ms off: original / fuse ort / fuse ort-cpu / ORT opt "
                "| CPU ms all: original / fuse ort / fuse ort-cpu / ORT opt "
                "| Outputs within rtol 1e-4 (fuse ort / ort-cpu / ORT opt) |",
                "|---|---|---|---|---|---|---|"]
        for m in ran:
            by = {r.tool: r for r in m.tools}
            names = ["original", *TOOLS]

            def one(fn, n, by=by):  # a fuse figure, and in brackets the same without its output check
                text = fn(by[n]) if n in by else "-"
                if n in NO_VERIFY and NO_VERIFY[n] in by:
                    text += f" ({fn(by[NO_VERIFY[n]])} no-verify)"
                return text

            def cell(fn, names=names):
                return " / ".join(one(fn, n) for n in names)

            nodes = cell(lambda r: "-" if r.nodes is None else str(r.nodes))
            off = cell(lambda r: _ms(r.latency.get("disabled", {}).get("cpu_median_ms")))
            on = cell(lambda r: _ms(r.latency.get("all", {}).get("cpu_median_ms")))
            match = cell(lambda r: "-" if r.matches is None else "yes" if r.matches else "NO", names=list(TOOLS))
            left_fuse = one(lambda r: _unfused(r.unfused) if r.nodes is not None else "-", "fuse-ort")
            left_ortx = _unfused(by["ort-transformers"].unfused) if by["ort-transformers"].nodes is not None else "-"
            out.append(f"| {m.name} | {nodes} | {left_fuse} | {left_ortx} | {off} | {on} | {match} |")
        out.append("")
    for m in models:
        out += [f"## {m.name}", "", f"{m.description}; {m.heads} heads, hidden {m.hidden}.", ""]
        if m.skipped:
            out += [f"Skipped: {m.skipped}.", ""]
            continue
        base = m.tools[0].latency
        rounds = ", ".join(f"{lv} {base[lv]['samples']} rounds of {base[lv]['runs_per_sample']} runs" for lv in LEVELS
                           if lv in base)
        out += [f"Inputs: {', '.join(f'{k} {chr(120).join(map(str, v))}' for k, v in m.inputs.items())}. "
                f"Timed (the original; the others alike): {rounds or '-'}.", ""]
        out += ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" if i in (0, 2, 3) else "---:"
                                                                 for i in range(len(HEADERS))) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in table_rows(m)]
        notes = model_notes(m)
        if notes:
            out += [""] + [f"- {n}" for n in notes]
        out.append("")
    return "\n".join(out)


def render_rich(run: Mapping[str, Any], models: Sequence[ModelResult], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    for m in models:
        if m.skipped:
            console.print(f"[bold]{m.name}[/bold]: skipped: {escape(m.skipped)}", highlight=False)
            continue
        table = Table(title=escape(f"{m.name}: {m.description}; {m.heads} heads, hidden {m.hidden}"),
                      title_justify="left")
        for i, header in enumerate(HEADERS):
            table.add_column(header, justify="left" if i in (0, 2, 3) else "right", overflow="fold")
        for row in table_rows(m):
            table.add_row(*map(escape, row))
        console.print(table)
        for note in model_notes(m):
            console.print(f"  - {note}", highlight=False, markup=False)
    for line in settings_lines(run):
        console.print(line, highlight=False, markup=False)


# ---- main --------------------------------------------------------------------------------------

def _load() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "-"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def select(specs: Sequence[ModelSpec], patterns: str | None) -> list[ModelSpec]:
    if not patterns:
        return list(specs)
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = [s for s in specs if any(fnmatch.fnmatchcase(s.name, p) for p in wanted)]
    unknown = [p for p in wanted if not any(fnmatch.fnmatchcase(s.name, p) for s in specs)]
    if unknown:
        raise SystemExit(f"unknown model {unknown[0]!r}: choose from {', '.join(s.name for s in specs)}")
    return chosen


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="few iterations (a smoke run; figures not worth comparing)")
    parser.add_argument("--models", help="comma-separated names or shell patterns (default: all): "
                        + ", ".join(s.name for s in model_specs()))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"Markdown file (default {DEFAULT_OUT.relative_to(REPO)})")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--ort-opt-level", type=int, choices=(0, 1), default=ORT_TX_OPT_LEVEL,
                        help="optimize_model's opt_level (default 1, its default for BERT)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    args = parse_args(argv)
    import onnxruntime as ort
    from rich.console import Console

    import fuse_cli

    console = Console(width=max(Console().width, 200))
    specs = select(model_specs(), args.models)
    started, load_before = time.perf_counter(), _load()
    models: list[ModelResult] = []
    with tempfile.TemporaryDirectory(prefix="vs-ortx-") as tmp:
        for spec in specs:
            console.print(f"[bold]{spec.name}[/bold] ({time.perf_counter() - started:.0f} s)", highlight=False)
            models.append(bench_model(spec, Path(tmp), args.quick, args.ort_opt_level,
                                      lambda s: console.print(s, highlight=False, markup=False)))
    run = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": _cpu_name(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "onnx": onnx.__version__, "onnxruntime": ort.__version__,
        "fuse": getattr(fuse_cli, "__version__", "?"), "load_before": load_before, "load_after": _load(),
        "seconds": round(time.perf_counter() - started, 1), "quick": args.quick, "ort_opt_level": args.ort_opt_level,
        "torch_stub": any(r.info.get("torch_stub") for m in models for r in m.tools),
    }
    render_rich(run, models, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render_markdown(run, models))
    console.print(f"Wrote {args.out}", highlight=False)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"run": run, "models": [asdict(m) for m in models]}, indent=2) + "\n")
        console.print(f"Wrote {args.json}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
