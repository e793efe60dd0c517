"""Bias-free self-attention on the CPU: 3 MatMuls + MultiHeadAttention vs packed Attention with a zero bias
(what packed-attention emits where the graph has no Q/K/V biases; results/crash_isolation.md).

    python benchmarks/bias_free_attention.py HIDDEN HEADS BATCH SEQUENCE     (e.g. 768 12 1 128)
"""
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper, numpy_helper
H, heads = int(sys.argv[1]), int(sys.argv[2])
B, S = int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
W = [rng.standard_normal((H, H)).astype(np.float32) * H**-0.5 for _ in range(3)]
x = helper.make_tensor_value_info("x", T.FLOAT, [B, S, H])
y = helper.make_tensor_value_info("y", T.FLOAT, [B, S, H])
ops = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
mha = helper.make_model(helper.make_graph(
    [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]) for i in range(3)] +
    [helper.make_node("MultiHeadAttention", ["p0", "p1", "p2"], ["y"], domain="com.microsoft", num_heads=heads)],
    "mha", [x], [y], [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(W)]), opset_imports=ops, ir_version=9)
att = helper.make_model(helper.make_graph(
    [helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft", num_heads=heads)],
    "att", [x], [y],
    [numpy_helper.from_array(np.concatenate(W, 1), "w"), numpy_helper.from_array(np.zeros(3 * H, np.float32), "b")]),
    opset_imports=ops, ir_version=9)
o = ort.SessionOptions()
o.intra_op_num_threads = 1
o.inter_op_num_threads = 1
o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
s = {n: ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])
     for n, m in (("mha", mha), ("att", att))}
feed = {"x": rng.standard_normal((B, S, H)).astype(np.float32)}
a, b = s["mha"].run(None, feed)[0], s["att"].run(None, feed)[0]
print("max abs diff", float(np.abs(a - b).max()))
t = {n: [] for n in s}
for r in range(21):
    for n in s:
        st = time.perf_counter()
        for _ in range(20):
            s[n].run(None, feed)
        t[n].append((time.perf_counter() - st) / 20 * 1e6)
m = {n: float(np.median(v)) for n, v in t.items()}
print(f"H={H} heads={heads} [{B},{S}] mha+matmuls {m['mha']:.0f} us, attention(zero bias) {m['att']:.0f} us, ratio "
      f"{m['att']/m['mha']:.3f}")
