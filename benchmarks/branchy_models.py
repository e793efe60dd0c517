"""Branchy models built here for the `schedule` benchmark and its tests: randomly wired networks
(Xie et al. 2019) and a transformer block with parallel Q/K/V projections."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8


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
    graph = helper.make_graph(nodes, "qkv_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
