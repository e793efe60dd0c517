"""Attention over grouped K/V without repeating them: one MultiHeadAttention per member of the
query groups.

repeat_kv gives query head i the K/V head i // n (n = H / KV, the heads of a group adjacent).
The query heads r, n + r, 2n + r, ... (member r of each group) read the KV heads 0, 1, ..., KV - 1
once each: the K/V as the cache holds them. The attention is thus n MultiHeadAttention nodes of
KV heads each, over the unrepeated [B, KV, T, d] K/V and the graph's own mask (one head, so it
serves every member):

  q [B, S, H*d] ─ Reshape [0, 0, KV, n, d] ─ Split(axis 3, n) ─┬─ Reshape [0, 0, KV*d] ─ MHA(K, V, mask; KV heads)
                                                               │    ─ Reshape [0, 0, KV, 1, d] ─┐
                                                               └─ (member 1 .. n-1, the same) ──┴─ Concat(axis 3)
                                                                                  ─ Reshape [0, 0, H*d] ─ y

Why not one MultiHeadAttention over the repeated K/V (it takes equal heads only): the repeat's
two [B, H, T, d] copies are alive with the kernel's scratch ([B, H, S, T] probabilities, the
query and the output head-major), which put the opset-17 Llama decode step at batch 64, 64 + 64
positions at 40.1 MiB against the unfused graph's 35.8 (memray, both as estimated). Split by
member, the repeat is gone and each node's scratch is 1/n of it: 32.2 MiB, and 0.77x the
unfused graph's time where the repeated form took 0.83x (one thread, graph optimizations off).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.toolkit.runtime_shapes import unnamed_like_the_original


def grouped_attention(query: gs.Tensor, key: gs.Tensor, value: gs.Tensor, mask_inputs: list[gs.Tensor],
                      attrs: dict, shape: tuple[int, int, int], out: gs.Variable, merge_shape: gs.Tensor | None,
                      unnamed: bool, g: GraphEditor, base: str) -> list[gs.Node]:
    """The nodes computing `out` = attention of `query` [B, S, H*d] over `key` and `value` [B, KV, T, d]
    repeated to H heads, `shape` = (H, KV, d). `merge_shape`: the graph's own merge of the heads
    (its rows), else [0, 0, H*d]. `unnamed`: read the query through Reshape(q, Shape(q)), so that
    every tensor of the group, none of which the replaced subgraph had, is unnamed to onnxruntime's
    planner as the replaced ones were (toolkit.runtime_shapes): named, the members' buffers are
    handed to the next layer's and held across its MLP (the same Llama step: 36.2 MiB)."""
    heads, kv, d = shape
    n = heads // kv
    nodes: list[gs.Node] = []
    if unnamed:
        viewed = g.variable(f"{base}_query_unnamed", like=query)
        nodes += unnamed_like_the_original(query, viewed, g, f"{base}_query")
        query = viewed
    grouped = g.variable(f"{base}_groups", like=query)
    members = [g.variable(f"{base}_member{r}", like=query) for r in range(n)]
    split = np.ones(n, np.int64)
    nodes += [reshape(query, [0, 0, kv, n, d], grouped, g, f"{base}_groups"),
              gs.Node("Split", g.unique_name(f"{base}_members"),
                      {"axis": 3, **({} if g.opset >= 13 else {"split": split})},
                      [grouped, *([g.constant(f"{base}_split", split)] if g.opset >= 13 else [])], members)]
    outputs = []
    for r, member in enumerate(members):
        q = g.variable(f"{base}_q{r}", like=query)
        y = g.variable(f"{base}_mha{r}_out", like=query)
        outputs.append(g.variable(f"{base}_y{r}", like=query))
        nodes += [reshape(member, [0, 0, kv * d], q, g, f"{base}_q{r}"),
                  gs.Node("MultiHeadAttention", g.unique_name(f"{base}_mha{r}"), {**attrs, "num_heads": kv},
                          [q, key, value, *mask_inputs], [y], domain="com.microsoft"),
                  reshape(y, [0, 0, kv, 1, d], outputs[-1], g, f"{base}_y{r}")]
    merged = g.variable(f"{base}_merged", like=query)
    merge = merge_shape if merge_shape is not None else g.constant(f"{base}_merge_shape", np.array([0, 0, heads * d]))
    return [*nodes, gs.Node("Concat", g.unique_name(f"{base}_merge_members"), {"axis": 3}, outputs, [merged]),
            gs.Node("Reshape", g.unique_name(f"{base}_merge"), {}, [merged, merge], [out])]


def reshape(x: gs.Tensor, dims: list[int], y: gs.Variable, g: GraphEditor, base: str) -> gs.Node:
    return gs.Node("Reshape", g.unique_name(base), {}, [x, g.constant(f"{base}_shape", np.array(dims, np.int64))], [y])
