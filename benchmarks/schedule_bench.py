"""The `schedule` pass (fuse_cli/schedule.py) on branchy graphs: estimated and measured peaks.

    .venv/bin/python benchmarks/schedule_bench.py [--rule onnxruntime] [--no-measure]
                                                  [--out benchmarks/results/schedule.md]

Groups: "branchy" (the light zoo models shipped inside onnx, the held-out corpus's googlenet,
inception-v3, densenet121, unet-small and efficientvit-m0 where /work/corpus-models/heldout has
them, a transformer block with parallel Q/K/V), "randwire" (randomly wired networks: 32 nodes,
Watts-Strogatz k=4 p=0.75, each node Relu-Conv3x3-BatchNormalization over the sum of its inputs,
several seeds). Per model: the estimated peak (profile_memory, onnxruntime's order) and the
measured one (fuse_cli.analysis.measure.measure_peak) before and after, the schedule time, and
whether onnxruntime's outputs are bitwise equal. Symbolic dims are bound to 1. Goals: geomean
measured after/before <= 0.90 on "branchy", <= 0.80 on "randwire", no model above 1.00.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli.analysis.measure import measure_peak  # noqa: E402
from fuse_cli.analysis.memory import profile_memory  # noqa: E402
from fuse_cli.analysis.shapes import infer_shapes  # noqa: E402
from fuse_cli.schedule import schedule  # noqa: E402
from fuse_cli.verify import make_session, random_inputs  # noqa: E402

HELDOUT = Path("/work/corpus-models/heldout")
HELDOUT_NAMES = ("googlenet-opset17", "inception-v3-opset17", "densenet121-opset17", "unet-small-opset17",
                 "efficientvit-m0-opset13")
LIGHT = ("light_inception_v1", "light_inception_v2", "light_densenet121", "light_squeezenet", "light_resnet50",
         "light_shufflenet")
IR_VERSION = 8
MiB = 1024 * 1024


def light_models() -> list[tuple[str, onnx.ModelProto]]:
    folder = Path(onnx.__file__).parent / "backend/test/data/light"
    return [(name, onnx.load(str(folder / f"{name}.onnx"))) for name in LIGHT if (folder / f"{name}.onnx").exists()]


def heldout_models() -> list[tuple[str, onnx.ModelProto]]:
    return [(name, onnx.load(str(HELDOUT / f"{name}.onnx"))) for name in HELDOUT_NAMES
            if (HELDOUT / f"{name}.onnx").exists()]


def watts_strogatz(n: int, k: int, p: float, rng: np.random.Generator) -> list[tuple[int, int]]:
    """networkx's watts_strogatz_graph: a ring where each node meets its k/2 nearest on each side,
    each edge's far end rewired with probability p to a node it does not meet yet."""
    edges = {(u, (u + j) % n) for u in range(n) for j in range(1, k // 2 + 1)}
    adjacent = {u: set() for u in range(n)}
    for u, v in edges:
        adjacent[u].add(v)
        adjacent[v].add(u)
    for j in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + j) % n
            if rng.random() < p:
                w = int(rng.integers(n))
                while w == u or w in adjacent[u]:
                    if len(adjacent[u]) >= n - 1:
                        break
                    w = int(rng.integers(n))
                else:
                    adjacent[u].discard(v)
                    adjacent[v].discard(u)
                    adjacent[u].add(w)
                    adjacent[w].add(u)
    return sorted({(min(u, v), max(u, v)) for u in adjacent for v in adjacent[u]})


def randwire(seed: int, nodes: int = 32, channels: int = 32, size: int = 56) -> onnx.ModelProto:
    """A randomly wired stage (Xie et al. 2019): edges oriented low to high index; a node sums its
    inputs (the stage input for a node without any), then Relu, Conv 3x3, BatchNormalization; the
    output is the mean of the nodes nobody reads. Stored in index order, the generator's."""
    rng = np.random.default_rng(seed)
    edges = watts_strogatz(nodes, 4, 0.75, rng)
    sources = {v: [u for u, w in edges if w == v] for v in range(nodes)}
    read = {u for u, _ in edges}
    graph_nodes, initializers = [], []
    out = {}
    for v in range(nodes):
        inputs = [out[u] for u in sources[v]] or ["x"]
        x = inputs[0]
        if len(inputs) > 1:
            x = f"sum{v}"
            graph_nodes.append(helper.make_node("Sum", inputs, [x], name=f"sum{v}"))
        w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1
        initializers += [numpy_helper.from_array(w, f"w{v}")]
        for name, value in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0)):
            initializers.append(numpy_helper.from_array(np.full(channels, value, np.float32), f"{name}{v}"))
        graph_nodes += [
            helper.make_node("Relu", [x], [f"relu{v}"], name=f"relu{v}"),
            helper.make_node("Conv", [f"relu{v}", f"w{v}"], [f"conv{v}"], name=f"conv{v}", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"conv{v}", f"scale{v}", f"bias{v}", f"mean{v}", f"var{v}"],
                             [f"bn{v}"], name=f"bn{v}"),
        ]
        out[v] = f"bn{v}"
    sinks = [out[v] for v in range(nodes) if v not in read]
    graph_nodes.append(helper.make_node("Mean", sinks, ["y"], name="mean"))
    shape = [1, channels, size, size]
    graph = helper.make_graph(graph_nodes, f"randwire{seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def parallel_qkv_transformer(seq: int = 512, hidden: int = 256, heads: int = 4, ffn: int = 1024) -> onnx.ModelProto:
    """One encoder block with Q, K and V projected in parallel from the normalized input, stored
    as an exporter writes it (Q, K, V in turn, then attention, then the MLP)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def weight(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name))
        return name

    def const(name, values):
        inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def op(op_type, inputs, name, **attrs):
        nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    head = hidden // heads
    x = "x"
    ln = op("LayerNormalization", [x, weight("g1", hidden), weight("b1", hidden)], "ln1", axis=-1)
    split = const("split_shape", [1, seq, heads, head])
    qkv = []
    for t in "qkv":
        proj = op("MatMul", [ln, weight(f"w{t}", hidden, hidden)], f"{t}_proj")
        r = op("Reshape", [proj, split], f"{t}_heads")
        qkv.append(op("Transpose", [r], f"{t}_t", perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]))
    scores = op("MatMul", [qkv[0], qkv[1]], "scores")
    probs = op("Softmax", [scores], "probs", axis=-1)
    ctx = op("MatMul", [probs, qkv[2]], "ctx")
    ctx = op("Transpose", [ctx], "ctx_t", perm=[0, 2, 1, 3])
    ctx = op("Reshape", [ctx, const("merge_shape", [1, seq, hidden])], "ctx_merged")
    attn = op("MatMul", [ctx, weight("wo", hidden, hidden)], "attn_out")
    h = op("Add", [x, attn], "residual1")
    ln2 = op("LayerNormalization", [h, weight("g2", hidden), weight("b2", hidden)], "ln2", axis=-1)
    up = op("MatMul", [ln2, weight("w1", hidden, ffn)], "ffn_up")
    act = op("Relu", [up], "ffn_act")
    down = op("MatMul", [act, weight("w2", ffn, hidden)], "ffn_down")
    op("Add", [h, down], "y")
    graph = helper.make_graph(nodes, "qkv_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def bind_all(model: onnx.ModelProto) -> dict[str, int]:
    return {d.dim_param: 1 for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}


def outputs_equal(a: onnx.ModelProto, b: onnx.ModelProto, dims: dict[str, int]) -> bool:
    first, second = make_session(a), make_session(b)
    feeds = random_inputs(first, dims=dims, seed=0)
    want, got = first.run(None, feeds), second.run(None, feeds)
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(want, got))


def run_one(group: str, name: str, model: onnx.ModelProto, rule: str, measure: bool) -> dict:
    dims = bind_all(model)
    shapes = infer_shapes(model, dims, symbolic=True)
    symbolic = infer_shapes(model)
    before = profile_memory(model, shapes, symbolic_shapes=symbolic).peak_bytes
    start = time.perf_counter()
    result = schedule(model, shapes, symbolic, rule=rule)
    seconds = time.perf_counter() - start
    after_model = result.model if result is not None else model
    after = profile_memory(after_model, shapes, symbolic_shapes=symbolic).peak_bytes
    row = {"group": group, "model": name, "nodes": len(model.graph.node), "est_before": before, "est_after": after,
           "seconds": seconds, "method": result.method if result else "kept", "equal": True,
           "meas_before": None, "meas_after": None}
    if result is not None:
        row["equal"] = outputs_equal(model, after_model, dims)
    if measure:
        row["meas_before"] = measure_peak(model, dims=dims).peak_bytes
        row["meas_after"] = measure_peak(after_model, dims=dims).peak_bytes if result is not None else row["meas_before"]
    print(f"{group:9} {name:26} est {before / MiB:8.2f} -> {after / MiB:8.2f} MiB  "
          f"meas {_mib(row['meas_before'])} -> {_mib(row['meas_after'])}  {seconds:6.2f} s  {row['method']}"
          f"  equal={row['equal']}", file=sys.stderr, flush=True)
    return row


def _mib(value: int | None) -> str:
    return "   n/a" if value is None else f"{value / MiB:6.2f}"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(rows: list[dict], rule: str) -> str:
    lines = [f"# `schedule` pass, rule `{rule}`", "",
             "Estimated: profile_memory (onnxruntime's order). Measured: measure_peak (onnxruntime CPU, "
             "arena and memory pattern off, one thread). Symbolic dims bound to 1.", "",
             "| group | model | nodes | est. before MiB | est. after MiB | meas. before MiB | meas. after MiB "
             "| meas. ratio | schedule s | won | outputs equal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["meas_after"] / r["meas_before"] if r["meas_before"] and r["meas_after"] else None
        lines.append(f"| {r['group']} | {r['model']} | {r['nodes']} | {r['est_before'] / MiB:.2f} | "
                     f"{r['est_after'] / MiB:.2f} | {_mib(r['meas_before']).strip()} | {_mib(r['meas_after']).strip()} | "
                     f"{'' if ratio is None else f'{ratio:.3f}'} | {r['seconds']:.2f} | {r['method']} | "
                     f"{'yes' if r['equal'] else 'NO'} |")
    lines += ["", "| group | geomean est. after/before | geomean meas. after/before | max meas. ratio | goal |",
              "|---|---|---|---|---|"]
    for group, goal in (("branchy", 0.90), ("randwire", 0.80)):
        mine = [r for r in rows if r["group"] == group]
        est = geomean([r["est_after"] / r["est_before"] for r in mine if r["est_before"]])
        meas = [r["meas_after"] / r["meas_before"] for r in mine if r["meas_before"] and r["meas_after"]]
        lines.append(f"| {group} | {est:.3f} | {geomean(meas):.3f} | {max(meas, default=float('nan')):.3f} | <= {goal} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rule", default="onnxruntime", choices=("onnxruntime", "stored", "both"))
    parser.add_argument("--no-measure", action="store_true")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/schedule.md"))
    args = parser.parse_args()
    models = [("branchy", n, m) for n, m in light_models() + heldout_models()]
    models.append(("branchy", "transformer-parallel-qkv", parallel_qkv_transformer()))
    models += [("randwire", f"randwire-ws-seed{s}", randwire(s)) for s in range(args.seeds)]
    rows = [run_one(group, name, model, args.rule, not args.no_measure) for group, name, model in models]
    text = markdown(rows, args.rule)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
