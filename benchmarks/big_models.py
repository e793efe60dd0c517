"""fuse on big models: a deep graph (time) and big weights (memory), beside the peers.

    make bench                                   # runs this after benchmarks/run.py
    .venv/bin/python benchmarks/big_models.py [--blocks 245] [--models DIR] [--fp32] [--no-peers]
                                              [--profile 15] [--skip-deep] [--skip-memory] [--keep DIR]

Deep: a stack of `--blocks` transformer encoder blocks in the decomposed form an exporter writes
(opset 17: LayerNorm as ReduceMean/Sub/Pow/..., GELU as Erf, attention through Reshape/
Transpose/Softmax), 49 nodes a block, at hidden size 32 so the weights stay small: 245 blocks are
~12k nodes. The figure is `fuse optimize` time over `onnx.load` + `onnx.save` time of the same
file, measured in one run: with and without --no-verify (verification runs both models in
onnxruntime). Each `fuse optimize` runs in a child process, its imports excluded from the time
(`fuse` as a command adds interpreter start-up and imports, about a second, also reported).
With --profile N, the N functions with the most cumulative time in a cProfile'd run are printed.

Memory: peak RSS over the model's size on disk (model file plus external data), and time over
onnx.load + onnx.save of the same model, for fuse optimize (verification on and off) and the peers
(onnx-simplifier, onnxslim, onnxruntime's offline optimizer at basic), each in its own process,
one after another; a run over --rss-cap-gb is killed. The models (memory_models.py): BERT-base
from --models (embedded, and re-saved with external data), a Conv+BN stack with embedded weights
(every weight rewritten), and a Llama-like decoder skeleton with random weights in external data,
fp16 (and fp32 with --fp32: 3.8 GB). Targets: fuse optimize <= 2x the model (<= 1.5x for the
decoder) with verification, the output's weights embedded or external as the input's were.
Disk use: the models and one output at a time; deleted at the end unless --keep is given.

The 2.5 GB MatMul chain `write_big_model` writes is what tests/test_big_models.py runs small.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_models as memory_models_lib  # noqa: E402 - the benchmark's own builders, beside it

REPO = Path(__file__).resolve().parents[1]
IR_VERSION = 8  # onnxruntime 1.31 rejects the IR 14 that onnx 1.23 writes by default
OPSET = 17  # LayerNormalization fuses; ReduceMean still takes axes as an attribute

HIDDEN = 32
HEADS = 4
FFN = 64
NODES_PER_BLOCK = 49

# Issue 18's time goals, relative to onnx-simplifier in the same run: `fuse optimize --no-verify`
# faster than it, `fuse optimize` (verification on) within this factor of it.
VERIFIED_OVER_ONNXSIM = 2.0
RSS_TARGET = 2.0  # peak RSS / model size on disk


# --- the deep stack ------------------------------------------------------------------------------


class _Stack:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value, dtype=np.float32) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, name: str, *shape: int) -> str:
        std = shape[0] ** -0.5 if len(shape) == 2 else 0.02
        return self.const(name, self.rng.normal(0.0, std, size=shape))

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def linear(self, x: str, name: str, n_in: int, n_out: int) -> str:
        x = self.op("MatMul", [x, self.weight(f"{name}.weight", n_in, n_out)], f"{name}_matmul")
        return self.op("Add", [self.weight(f"{name}.bias", n_out), x], f"{name}_add")

    def layer_norm(self, x: str, name: str) -> str:
        mean = self.op("ReduceMean", [x], f"{name}_mean", axes=[-1], keepdims=1)
        centered = self.op("Sub", [x, mean], f"{name}_sub")
        squared = self.op("Pow", [centered, "two"], f"{name}_pow")
        variance = self.op("ReduceMean", [squared], f"{name}_var", axes=[-1], keepdims=1)
        x = self.op("Sqrt", [self.op("Add", [variance, "epsilon"], f"{name}_add_eps")], f"{name}_sqrt")
        x = self.op("Div", [centered, x], f"{name}_div")
        gamma = self.const(f"{name}.weight", self.rng.uniform(0.5, 1.5, HIDDEN))
        x = self.op("Mul", [x, gamma], f"{name}_mul_gamma")
        return self.op("Add", [x, self.weight(f"{name}.bias", HIDDEN)], f"{name}_add_beta")

    def heads(self, x: str, name: str, perm: list[int]) -> str:
        return self.op("Transpose", [self.op("Reshape", [x, "split_heads"], f"{name}_reshape")], f"{name}_transpose",
                       perm=perm)

    def block(self, x: str, i: int) -> str:
        p = f"l{i}"
        q = self.heads(self.linear(x, f"{p}_query", HIDDEN, HIDDEN), f"{p}_query", [0, 2, 1, 3])
        k = self.heads(self.linear(x, f"{p}_key", HIDDEN, HIDDEN), f"{p}_key", [0, 2, 3, 1])
        v = self.heads(self.linear(x, f"{p}_value", HIDDEN, HIDDEN), f"{p}_value", [0, 2, 1, 3])
        scores = self.op("Div", [self.op("MatMul", [q, k], f"{p}_qk"), "attn_scale"], f"{p}_scale")
        context = self.op("MatMul", [self.op("Softmax", [scores], f"{p}_softmax", axis=-1), v], f"{p}_context")
        context = self.op("Transpose", [context], f"{p}_merge_transpose", perm=[0, 2, 1, 3])
        context = self.op("Reshape", [context, "merge_heads"], f"{p}_merge_reshape")
        attn = self.layer_norm(self.op("Add", [self.linear(context, f"{p}_attn_out", HIDDEN, HIDDEN), x],
                                       f"{p}_attn_residual"), f"{p}_ln1")
        h = self.linear(attn, f"{p}_ffn_in", HIDDEN, FFN)
        erf = self.op("Erf", [self.op("Div", [h, "sqrt2"], f"{p}_gelu_div")], f"{p}_gelu_erf")
        h = self.op("Mul", [h, self.op("Add", [erf, "one"], f"{p}_gelu_add_one")], f"{p}_gelu_mul")
        h = self.op("Mul", [h, "half"], f"{p}_gelu_half")
        h = self.op("Add", [self.linear(h, f"{p}_ffn_out", FFN, HIDDEN), attn], f"{p}_ffn_residual")
        return self.layer_norm(h, f"{p}_ln2")


def build_deep_stack(blocks: int, seed: int = 0) -> onnx.ModelProto:
    """`blocks` post-LN encoder blocks, decomposed as torch exports them."""
    s = _Stack(np.random.default_rng(seed))
    for name, value in (("two", 2.0), ("epsilon", 1e-5), ("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5),
                        ("attn_scale", float(np.sqrt(HIDDEN // HEADS)))):
        s.const(name, value)
    s.const("split_heads", [0, -1, HEADS, HIDDEN // HEADS], np.int64)
    s.const("merge_heads", [0, 0, HIDDEN], np.int64)
    x = "hidden"
    for i in range(blocks):
        x = s.block(x, i)
    s.nodes[-1].output[0] = "output"
    graph = helper.make_graph(
        s.nodes, "deep_stack",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])], s.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                             producer_name="fuse-benchmark")


# --- the model over 2 GB -----------------------------------------------------------------------


def write_big_model(path: Path, weights: int, dim: int, seed: int = 0) -> int:
    """`weights` [dim, dim] float32 MatMul weights in `path`.data, written a row block at a time
    (never a whole weight in memory); returns the total bytes on disk (model file + data).

        x ─ MatMul(W0) ─ Add(b) ─ LayerNorm (decomposed) ─ MatMul(W1) ─ ... ─ y
    """
    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    nodes, initializers = [], []
    rows_per_block = max(1, (64 * 2**20) // (dim * 4))
    with open(path.parent / data_name, "wb") as data:
        for i in range(weights):
            offset = data.tell()
            for start in range(0, dim, rows_per_block):
                rows = min(rows_per_block, dim - start)
                block = rng.standard_normal((rows, dim), dtype=np.float32)
                block *= dim ** -0.5
                data.write(block.tobytes())
            tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[dim, dim])
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(dim * dim * 4))):
                tensor.external_data.add(key=key, value=value)
            initializers.append(tensor)
    initializers += [numpy_helper.from_array(np.full(dim, 0.01, np.float32), "bias"),
                     numpy_helper.from_array(np.ones(dim, np.float32), "gamma"),
                     numpy_helper.from_array(np.zeros(dim, np.float32), "beta"),
                     numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                     numpy_helper.from_array(np.array(1e-5, np.float32), "epsilon")]
    x = "x"
    for i in range(weights):
        p = f"s{i}"
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"{p}_mm"], name=f"{p}_matmul"))
        nodes.append(helper.make_node("Add", [f"{p}_mm", "bias"], [f"{p}_biased"], name=f"{p}_bias"))
        x = f"{p}_biased"
        if i < weights - 1:
            ln = [("ReduceMean", [x], "mean", {"axes": [-1]}), ("Sub", [x, "{p}_mean"], "sub", {}),
                  ("Pow", ["{p}_sub", "two"], "pow", {}), ("ReduceMean", ["{p}_pow"], "var", {"axes": [-1]}),
                  ("Add", ["{p}_var", "epsilon"], "add_eps", {}), ("Sqrt", ["{p}_add_eps"], "sqrt", {}),
                  ("Div", ["{p}_sub", "{p}_sqrt"], "div", {}), ("Mul", ["{p}_div", "gamma"], "mul", {}),
                  ("Add", ["{p}_mul", "beta"], "add", {})]
            for op, inputs, name, attrs in ln:
                nodes.append(helper.make_node(op, [n.format(p=p) for n in inputs], [f"{p}_{name}"],
                                              name=f"{p}_{name}_node", **attrs))
            x = f"{p}_add"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "big_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="fuse-benchmark")
    onnx.save(model, str(path))
    return model_size(path)


model_size = memory_models_lib.model_size
uses_external_data = memory_models_lib.uses_external_data


# --- measuring -----------------------------------------------------------------------------------


def load_save_seconds(path: Path, scratch: Path, repeats: int = 3) -> float:
    """The best of `repeats` onnx.load + onnx.save of `path` (the unit the time target counts in)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        onnx.save(onnx.load(str(path)), str(scratch / "load_save.onnx"))
        best = min(best, time.perf_counter() - start)
    return best


_PEAK_RSS = """
def peak_rss():
    # this process's own high-water mark: os.wait4's ru_maxrss would count the parent's resident
    # size at fork too (Linux carries it over exec)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
"""


# The child: imports first (not timed), then one `fuse optimize` through the CLI's own entry point.
_CHILD = _PEAK_RSS + textwrap.dedent("""
    import contextlib, cProfile, io, json, os, pstats, sys, time
    from fuse_cli.cli import cli
    import fuse_cli.analysis.memory as memory, fuse_cli.audit as audit, fuse_cli.scheduling.search as search
    args, profile_top = json.loads(sys.argv[1]), int(sys.argv[2])
    # The memory model's CPU time (issue 13's audit time): the outermost calls of its two entry points.
    memory_cpu, depth = [0.0], [0]
    def counted(function):
        def call(*a, **k):
            depth[0] += 1
            began = time.process_time()
            try:
                return function(*a, **k)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    memory_cpu[0] += time.process_time() - began
        return call
    for name in ("profile_memory", "profile_memory_at"):
        wrapped = counted(getattr(memory, name))
        for module in (memory, audit, search):
            if hasattr(module, name):
                setattr(module, name, wrapped)
    profiler = cProfile.Profile() if profile_top else None
    start = time.perf_counter()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        if profiler:
            profiler.enable()
        try:
            cli.main(args, prog_name="fuse", standalone_mode=False)
            code = 0
        except SystemExit as exc:
            code = exc.code
        if profiler:
            profiler.disable()
    seconds = time.perf_counter() - start
    top = ""
    if profiler:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(profile_top)
        top = text.getvalue()
    print(json.dumps({"seconds": seconds, "exit": code, "profile": top, "peak_rss": peak_rss(),
                      "memory_model_cpu_s": memory_cpu[0]}))
""")


def run_fuse(args: list[str], *, profile_top: int = 0) -> dict:
    """`fuse optimize ARGS` in a child process: its time (imports excluded), exit code, peak RSS."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(["optimize", *args]), str(profile_top)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.communicate()
    wall = time.perf_counter() - started
    if child.returncode != 0 or not out.strip():
        raise RuntimeError(f"fuse optimize {' '.join(args)} failed ({child.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_seconds"] = wall
    return result


# The same deep file through graphsurgeon alone (the floor of any pass built on it) and through the
# peers, each in a child process with its imports outside the time.
_PEER_CHILD = _PEAK_RSS + textwrap.dedent("""
    import contextlib, json, os, sys, time
    import onnx
    tool, source, destination = sys.argv[1:4]
    # keep the weights where the input had them (a model over 2 GB cannot be saved otherwise)
    external = len(sys.argv) > 4 and sys.argv[4] == "1"
    def save(model):
        onnx.save(model, destination, save_as_external_data=external, location=os.path.basename(destination) + ".data")
    if tool == "onnx.load + onnx.save":
        def work():
            save(onnx.load(source))
    elif tool == "graphsurgeon round trip":
        import onnx_graphsurgeon as gs
        def work():
            graph = gs.import_onnx(onnx.load(source))
            graph.cleanup().toposort()
            onnx.save(gs.export_onnx(graph), destination)
    elif tool == "onnxruntime basic":
        import onnxruntime as ort
        def work():
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            options.optimized_model_filepath = destination
            options.log_severity_level = 3
            if external:
                options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                                 os.path.basename(destination) + ".data")
            ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    elif tool == "onnxsim":
        import onnxsim
        def work():
            save(onnxsim.simplify(onnx.load(source))[0])
    elif tool == "onnxslim":
        import onnxslim
        def work():
            save(onnxslim.slim(onnx.load(source)))
    elif tool == "onnxoptimizer":
        import onnxoptimizer
        def work():
            save(onnxoptimizer.optimize(onnx.load(source)))
    start = time.perf_counter()
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        work()
    print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss": peak_rss()}))
""")
PEERS = ("graphsurgeon round trip", "onnxruntime basic", "onnxsim", "onnxslim", "onnxoptimizer")
PEER_TIMEOUT_S = 600


def peer_seconds(tool: str, source: Path, destination: Path) -> float | str:
    """Seconds of one peer run, or why there is none (not installed, failed, timed out)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PEER_CHILD, tool, str(source), str(destination)], cwd=REPO,
                              capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"over {PEER_TIMEOUT_S} s"
    if done.returncode != 0 or not done.stdout.strip():
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return "not installed" if "ModuleNotFoundError" in last else last[:120]
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


# fuse (with and without verification) and onnx-simplifier, the goal's comparison, run in turn this
# many times: one run of each moves by 20% on a shared machine; the medians and the median of the
# per-round ratios are what the table states
DEEP_ROUNDS = 3


def bench_deep(blocks: int, work: Path, profile_top: int) -> dict:
    model = build_deep_stack(blocks)
    path = work / "deep_stack.onnx"
    onnx.save(model, str(path))
    nodes = len(model.graph.node)
    del model
    base = load_save_seconds(path, work)
    out = str(work / "deep_stack.fused.onnx")
    rounds = []
    for _ in range(DEEP_ROUNDS):
        verified = run_fuse([str(path), "-o", out])
        unverified = run_fuse([str(path), "-o", out, "--no-verify"], profile_top=0)
        rounds.append((verified, unverified, peer_seconds("onnxsim", path, work / "deep_stack.peer.onnx")))
    fused = onnx.load(out, load_external_data=False)
    verified = min((r[0] for r in rounds), key=lambda r: r["seconds"])
    fuse_s = statistics.median(r[0]["seconds"] for r in rounds)
    no_verify_s = statistics.median(r[1]["seconds"] for r in rounds)
    row = {
        "nodes": nodes, "nodes_after": len(fused.graph.node), "load_save_s": base, "rounds": DEEP_ROUNDS,
        "fuse_s": fuse_s, "fuse_no_verify_s": no_verify_s,
        "ratio": fuse_s / base, "ratio_no_verify": no_verify_s / base,
        "command_s": verified["wall_seconds"], "exit": verified["exit"],
        "memory_model_cpu_s": statistics.median(r[1].get("memory_model_cpu_s") or 0.0 for r in rounds),
        # verification's sessions go on beside the pipeline for small weights: what that holds
        "peak_rss_mib": statistics.median(r[0]["peak_rss"] for r in rounds) / 2**20,
        "peak_rss_no_verify_mib": statistics.median(r[1]["peak_rss"] for r in rounds) / 2**20,
    }
    simplified = [r[2] for r in rounds]
    timed = all(isinstance(s, float) for s in simplified)  # else why onnx-simplifier has no time
    if timed:
        row["over_onnxsim"] = {"verified": statistics.median(r[0]["seconds"] / r[2] for r in rounds),
                               "no_verify": statistics.median(r[1]["seconds"] / r[2] for r in rounds)}
    onnxsim = statistics.median(simplified) if timed else simplified[0]
    row["peers"] = {tool: onnxsim if tool == "onnxsim" else peer_seconds(tool, path, work / "deep_stack.peer.onnx")
                    for tool in PEERS}
    if profile_top:
        row["profile"] = run_fuse([str(path), "-o", out], profile_top=profile_top)["profile"]
    return row


# --- memory: peak RSS over the model's size, beside the peers --------------------------------------

MEMORY_PEERS = ("onnxsim", "onnxslim", "onnxruntime basic")
DECODER_RSS_TARGET = 1.5  # the 1B-class decoder skeleton, verification on
_POLL_S = 0.05


def measured(argv: list[str], rss_cap: int, timeout: float = PEER_TIMEOUT_S) -> dict:
    """Run a child (`python -c ...`) that prints {"seconds": ..., "peak_rss": ...} last: its seconds
    and peak RSS (its own VmHWM), or why there is none. A child over `rss_cap` is killed, so a peer that
    needs several times the model cannot take the machine down with it."""
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        child = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=out, stderr=err)
        started, killed, peak = time.perf_counter(), None, 0
        while True:
            pid, status, _ = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            rss = _rss_of(child.pid)
            peak = max(peak, rss)  # sampled: the figure for a run that never reports its own
            if not killed and (rss > rss_cap or time.perf_counter() - started > timeout):
                killed = (f"killed over the {rss_cap / 1e9:.0f} GB RSS cap" if rss > rss_cap
                          else f"killed after {timeout:.0f} s")
                child.kill()
            time.sleep(_POLL_S)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
        tail = (err.read().decode(errors="replace").strip().splitlines() or ["failed"])[-1]
    row = {"rss": peak}
    if killed:
        row["error"] = killed
    elif child.returncode != 0 or not lines:
        row["error"] = "not installed" if "ModuleNotFoundError" in tail else tail[:120]
    else:
        reply = json.loads(lines[-1])
        row.update(seconds=reply["seconds"], rss=reply["peak_rss"])
    return row


def _rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_models(work: Path, args) -> list[tuple[str, Path, float]]:
    """(label, path, peak RSS target) of each model the table measures, built or converted in `work`."""
    models = []
    bert = Path(args.models) / "bert-base-opset17.onnx" if args.models else None
    if bert is not None and bert.is_file():
        external = work / "bert-external" / "bert.onnx"
        external.parent.mkdir(exist_ok=True)
        memory_models_lib.to_external_data(bert, external)
        models += [("BERT-base, embedded", bert, RSS_TARGET), ("BERT-base, external data", external, RSS_TARGET)]
    conv = work / "conv_bn_stack.onnx"
    memory_models_lib.write_conv_bn_stack(conv, layers=args.conv_layers, channels=args.channels)
    models.append((f"Conv+BN stack ({args.conv_layers} x {args.channels} ch), embedded", conv, RSS_TARGET))
    for dtype in ("float16", "float32") if args.fp32 else ("float16",):
        path = work / f"decoder_{dtype}" / "decoder.onnx"
        path.parent.mkdir(exist_ok=True)
        memory_models_lib.write_decoder(path, layers=args.layers, hidden=args.hidden, ffn=args.ffn, vocab=args.vocab,
                                        heads=args.heads, dtype=dtype)
        label = f"decoder {args.layers} x {args.hidden} {dtype[5:] and 'fp' + dtype[5:]}, external data"
        models.append((label, path, DECODER_RSS_TARGET))
    return models


def bench_memory(work: Path, args) -> list[dict]:
    """Each model through onnx.load + onnx.save, fuse optimize (verification on and off) and the
    peers, one after another, each in a child: time and peak RSS."""
    rows = []
    for label, path, target in memory_models(work, args):
        size, external = model_size(path), uses_external_data(path)
        out = path.with_name(path.stem + ".out.onnx")
        row = {"model": label, "model_bytes": size, "external": external, "target": target, "runs": {}}
        runs = [("onnx.load + onnx.save", ["-c", _PEER_CHILD, "onnx.load + onnx.save", str(path), str(out),
                                           str(int(external))]),
                ("fuse optimize", ["-c", _CHILD, json.dumps(["optimize", str(path), "-o", str(out)]), "0"]),
                ("fuse optimize --no-verify", ["-c", _CHILD, json.dumps(["optimize", str(path), "-o", str(out),
                                                                         "--no-verify"]), "0"])]
        runs += [(tool, ["-c", _PEER_CHILD, tool, str(path), str(out), str(int(external))])
                 for tool in ([] if args.no_peers else MEMORY_PEERS)]
        for tool, argv in runs:
            row["runs"][tool] = measured(argv, int(args.rss_cap_gb * 1e9))
            if tool == "fuse optimize" and "error" not in row["runs"][tool]:
                row["output_external"] = uses_external_data(out)
            for written in (out, out.with_name(out.name + ".data")):
                written.unlink(missing_ok=True)
        rows.append(row)
    return rows


def print_memory(rows: list[dict]) -> bool:
    """The table; True when every fuse run with verification met its target."""
    met = True
    print("peak RSS / model size and time / (onnx.load + onnx.save), each tool in its own process:")
    for row in rows:
        base = row["runs"]["onnx.load + onnx.save"].get("seconds")
        print(f"{row['model']}: {row['model_bytes'] / 1e9:.2f} GB")
        for tool, run in row["runs"].items():
            rss = f"{run['rss'] / 1e9:6.2f} GB {run['rss'] / row['model_bytes']:5.2f}x"
            if "error" in run:
                print(f"  {tool:<28} {rss}   {run['error']}")
                continue
            ratio = f"{run['seconds'] / base:6.1f}x" if base else "     -"
            print(f"  {tool:<28} {rss}   {run['seconds']:7.1f} s {ratio}")
        fuse = row["runs"]["fuse optimize"]
        ok = "error" not in fuse and fuse["rss"] <= row["target"] * row["model_bytes"] \
            and row.get("output_external") == row["external"]
        met &= ok
        print(f"  target: fuse optimize <= {row['target']:.1f}x the model, output "
              f"{'external' if row['external'] else 'embedded'} like the input: {'met' if ok else 'NOT MET'}")
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=245, help="encoder blocks in the deep stack (49 nodes each)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions of a profile")
    parser.add_argument("--models", default=os.environ.get("MODELS"), metavar="DIR",
                        help="a folder holding bert-base-opset17.onnx (make bench-corpus; default $MODELS)")
    parser.add_argument("--layers", type=int, default=16, help="decoder skeleton layers")
    parser.add_argument("--hidden", type=int, default=2048, help="decoder hidden size")
    parser.add_argument("--ffn", type=int, default=5632, help="decoder MLP size")
    parser.add_argument("--vocab", type=int, default=32000, help="decoder vocabulary")
    parser.add_argument("--heads", type=int, default=16, help="decoder attention heads")
    parser.add_argument("--fp32", action="store_true", help="also the fp32 decoder (3.8 GB at the default sizes)")
    parser.add_argument("--conv-layers", type=int, default=61, help="Conv+BN stack layers (61 x 512 ch: 577 MB)")
    parser.add_argument("--channels", type=int, default=512, help="Conv+BN stack channels")
    parser.add_argument("--rss-cap-gb", type=float, default=12.0, help="kill a run whose RSS passes this")
    parser.add_argument("--no-peers", action="store_true", help="only onnx.load + onnx.save and fuse in the table")
    parser.add_argument("--skip-deep", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--keep", metavar="DIR", help="build in DIR and keep the files")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    args = parser.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fuse-big-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    failed = False
    try:
        if not args.skip_deep:
            deep = results["deep"] = bench_deep(args.blocks, work, args.profile)
            print(f"deep stack: {deep['nodes']} nodes -> {deep['nodes_after']}")
            print(f"  onnx.load + onnx.save          {deep['load_save_s']:8.3f} s   1.0x")
            print(f"  fuse optimize                  {deep['fuse_s']:8.3f} s {deep['ratio']:5.1f}x"
                  f"   (as a command, with start-up: {deep['command_s']:.2f} s; "
                  f"peak RSS {deep['peak_rss_mib']:.0f} MiB)")
            print(f"  fuse optimize --no-verify      {deep['fuse_no_verify_s']:8.3f} s {deep['ratio_no_verify']:5.1f}x"
                  f"   (of which the memory model {deep['memory_model_cpu_s']:.2f} s CPU; peak RSS "
                  f"{deep['peak_rss_no_verify_mib']:.0f} MiB)")
            for tool, seconds in deep["peers"].items():
                shown = (f"{seconds:8.3f} s {seconds / deep['load_save_s']:5.1f}x" if isinstance(seconds, float)
                         else f"{seconds}")
                print(f"  {tool:<30} {shown}")
            over = deep.get("over_onnxsim")
            if over:
                unverified, verified = over["no_verify"], over["verified"]
                ok = unverified < 1.0 and verified <= VERIFIED_OVER_ONNXSIM
                failed |= not ok
                print(f"  over onnxsim (median of {deep['rounds']} rounds, each tool in turn): --no-verify "
                      f"{unverified:.2f}x (goal < 1), verified {verified:.2f}x "
                      f"(goal <= {VERIFIED_OVER_ONNXSIM:.0f}): {'met' if ok else 'NOT MET'}")
            if deep.get("profile"):
                print(deep["profile"])
        if not args.skip_memory:
            results["memory"] = bench_memory(work, args)
            results["memory_settings"] = {k: getattr(args, k) for k in
                                          ("layers", "hidden", "ffn", "vocab", "heads", "fp32", "conv_layers",
                                           "channels", "no_peers")}
            results["memory_settings"]["models"] = "given" if args.models else None
            failed |= not print_memory(results["memory"])
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
