"""BERT on onnxruntime's CPU provider: is the packed-QKV com.microsoft Attention, or
EmbedLayerNormalization, faster than what fuse emits today?

  attention  (a) MatMul(x, Wq), MatMul(x, Wk), MatMul(x, Wv) -> MultiHeadAttention(q, k, v, bias,
                 attention_bias)                                  fuse's --target ort-cpu output
             (b) Attention(x, [Wq|Wk|Wv], bias, attention_bias=the same 4-D additive mask)
             (b') Attention(x, [Wq|Wk|Wv], bias, mask_index=the [B, S] 0/1 mask as int32)
  embedding  (a) Gather(word, ids) + Gather(segment, type ids) + Gather(position, Slice of the
                 position-id buffer) -> Add -> Add -> LayerNormalization     the export, as fused
             (b) Cast(ids, int32) x 2 -> EmbedLayerNormalization(.., mask) -> output, mask_index

Micro models hold one layer's attention or the embedding at BERT-small (hidden 256, 4 heads, the
corpus's bert-small) and BERT-base (768, 12 heads) shapes; whole models are fuse's output of the
corpus BERTs against the same output with (b) spliced in by `packed()` / `embedded()` below.

Timing: one intra-op and one inter-op thread, so time.thread_time is the model's CPU work; all
variants of a cell live in one process and are sampled in interleaved rounds (the order rotating
each round), so load from other processes hits each alike. "a again" is a second session of (a):
its ratio to (a) is the noise floor. Ratios are medians of the per-round ratio to (a), with the
quartiles. Peak: fuse_cli.analysis.measure.measure_peak at graph optimization disabled.

    .venv/bin/python benchmarks/bert_packed_attention.py [--rounds 15] [--models] [--micro]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fuse_cli.analysis.measure import measure_peak  # noqa: E402
from fuse_cli.core.sessions import make_session  # noqa: E402

MS = "com.microsoft"
FILL = float(np.finfo(np.float32).min)  # what transformers' exports add where the mask is 0
SAMPLE_CPU_S = 0.02
INT_RANGES = {"ids": (0, 1000), "input_ids": (0, 1000), "types": (0, 2), "token_type_ids": (0, 2)}


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "bench", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def attention_micro(form: str, hidden: int, heads: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = [rng.normal(0, hidden ** -0.5, (hidden, hidden)).astype(np.float32) for _ in range(3)]
    bias = rng.uniform(-0.1, 0.1, 3 * hidden).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", hidden])
    inits = [numpy_helper.from_array(bias, "bias")]
    if form == "index":
        mask = helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"])
    else:
        mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", 1, "S", "S"])
    if form == "mha":
        inits += [numpy_helper.from_array(wi, f"w{i}") for i, wi in enumerate(w)]
        nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]) for i in range(3)]
        nodes.append(helper.make_node("MultiHeadAttention", ["p0", "p1", "p2", "bias", "", "mask"], ["y"],
                                      domain=MS, num_heads=heads))
    else:
        inits.append(numpy_helper.from_array(np.concatenate(w, axis=1), "w"))
        ins = ["x", "w", "bias", "mask"] if form == "index" else ["x", "w", "bias", "", "", "mask"]
        nodes = [helper.make_node("Attention", ins, ["y"], domain=MS, num_heads=heads)]
    return _model(nodes, [x, mask], [y], inits)


def embedding_micro(form: str, hidden: int, vocab: int = 30522) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    tables = {"word": rng.normal(0, 0.02, (vocab, hidden)), "position": rng.normal(0, 0.02, (512, hidden)),
              "segment": rng.normal(0, 0.02, (2, hidden))}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tables.items()]
    inits += [numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "beta"),
              numpy_helper.from_array(np.arange(512, dtype=np.int64)[None], "position_ids")]
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"]) for n in ("ids", "types", "mask")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", hidden])
    nodes = [helper.make_node("Shape", ["ids"], ["len"], start=1, end=2)]
    inits += [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("one", 1))]
    nodes.append(helper.make_node("Slice", ["position_ids", "zero", "len", "one"], ["positions"]))
    outputs = [y]
    if form == "decomposed":
        nodes += [helper.make_node("Gather", ["word", "ids"], ["w"]),
                  helper.make_node("Gather", ["segment", "types"], ["s"]),
                  helper.make_node("Add", ["w", "s"], ["ws"]),
                  helper.make_node("Gather", ["position", "positions"], ["p"]),
                  helper.make_node("Add", ["ws", "p"], ["e"]),
                  helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["y"], epsilon=1e-12)]
        ins = ins[:2]
    else:
        nodes += [helper.make_node("Cast", [n], [f"{n}32"], to=TensorProto.INT32)
                  for n in ("ids", "types", "positions", "mask")]
        nodes.append(helper.make_node("EmbedLayerNormalization",
                                      ["ids32", "types32", "word", "position", "segment", "gamma", "beta", "mask32",
                                       "positions32"], ["y", "mask_index"], domain=MS, epsilon=1e-12))
        outputs.append(helper.make_tensor_value_info("mask_index", TensorProto.INT32, ["B"]))
    return _model(nodes, ins, outputs, inits)


# --- the same rewrites on a whole model (fuse's output) -------------------------------------------


def packed(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each MultiHeadAttention over three MatMuls of one x by constant weights -> Attention."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    drop = set()
    for node in list(g.node):
        if node.op_type != "MultiHeadAttention":
            continue
        mm = [producer.get(t) for t in node.input[:3]]
        if not all(m is not None and m.op_type == "MatMul" and m.input[1] in inits for m in mm) or \
                len({m.input[0] for m in mm}) != 1:
            continue
        w = np.concatenate([numpy_helper.to_array(inits[m.input[1]]) for m in mm], axis=1)
        g.initializer.append(numpy_helper.from_array(w, node.name + "_qkv_weight"))
        bias = list(node.input[3:4]) or [""]
        mask = list(node.input[5:6]) or [""]
        new = helper.make_node("Attention", [mm[0].input[0], node.name + "_qkv_weight", *bias, "", "", *mask],
                               list(node.output), name=node.name + "_packed", domain=MS,
                               **{a.name: helper.get_attribute_value(a) for a in node.attribute})
        g.node.insert(list(g.node).index(node), new)
        g.node.remove(node)
        drop.update(id(m) for m in mm)
    for m in [n for n in g.node if id(n) in drop]:
        g.node.remove(m)
    return model


def embedded(model: onnx.ModelProto) -> onnx.ModelProto:
    """BERT's embedding (three Gathers, two Adds, LayerNormalization) -> EmbedLayerNormalization,
    with the graph's position ids and the attention_mask input (mask_index unused)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name for i in g.initializer}
    ln = next(n for n in g.node if n.op_type == "LayerNormalization")
    gathers = {}
    stack, adds = [ln.input[0]], []
    while stack:
        node = producer[stack.pop()]
        if node.op_type == "Add":
            adds.append(node)
            stack += list(node.input)
        else:
            assert node.op_type == "Gather" and node.input[0] in inits, node
            gathers[node.input[1]] = node
    by_table = {n.input[0]: n for n in gathers.values()}
    word = next(n for k, n in by_table.items() if "word" in k)
    position = next(n for k, n in by_table.items() if "position" in k)
    segment = next(n for k, n in by_table.items() if "token_type" in k)
    casts = []
    for name in (word.input[1], segment.input[1], position.input[1], "attention_mask"):
        casts.append(helper.make_node("Cast", [name], [name + "_int32"], to=TensorProto.INT32))
    eps = next((helper.get_attribute_value(a) for a in ln.attribute if a.name == "epsilon"), 1e-5)
    eln = helper.make_node("EmbedLayerNormalization",
                           [word.input[1] + "_int32", segment.input[1] + "_int32", word.input[0], position.input[0],
                            segment.input[0], ln.input[1], ln.input[2], "attention_mask_int32",
                            position.input[1] + "_int32"], [ln.output[0], "embed_mask_index"],
                           domain=MS, epsilon=eps, name="embed_layer_norm")
    at = list(g.node).index(ln)
    for node in [*casts, eln][::-1]:
        g.node.insert(at, node)
    for node in [ln, *adds, *gathers.values()]:
        g.node.remove(node)
    return model


# --- timing -------------------------------------------------------------------------------------


def feeds_for(model: onnx.ModelProto, b: int, s: int, hidden: int = 0) -> dict:
    rng = np.random.default_rng(1)
    lengths = rng.integers(s // 2, s + 1, b)
    lengths[0] = s
    keep = (np.arange(s)[None] < lengths[:, None])
    feeds = {}
    for i in model.graph.input:
        if i.name in ("x",):
            feeds[i.name] = rng.standard_normal((b, s, hidden)).astype(np.float32)
        elif i.name == "mask" and i.type.tensor_type.elem_type == TensorProto.FLOAT:
            feeds[i.name] = np.where(keep, 0.0, FILL).astype(np.float32)[:, None, None, :].repeat(s, axis=2)
        elif i.name in ("mask", "attention_mask"):
            dtype = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            feeds[i.name] = keep.astype(dtype)
        elif i.name in ("ids", "input_ids"):
            feeds[i.name] = rng.integers(0, 1000, (b, s)).astype(np.int64)
        elif i.name in ("types", "token_type_ids"):
            feeds[i.name] = rng.integers(0, 2, (b, s)).astype(np.int64)
    return feeds


def interleaved(models: dict[str, onnx.ModelProto], feeds: dict, level: str, rounds: int) -> dict:
    """{variant: (median us a run, ratio to "a" median [p25, p75])}; "a again" is (a) once more."""
    models = {"a": models["a"], "a again": models["a"], **{k: v for k, v in models.items() if k != "a"}}
    sessions = {k: make_session(m, level=level, threads=1) for k, m in models.items()}
    names = {k: [i.name for i in s.get_inputs()] for k, s in sessions.items()}
    feed = {k: {n: feeds[n] for n in names[k]} for k in sessions}
    per_run = {}
    for k, sess in sessions.items():
        start, count = time.thread_time(), 0
        while count < 3 or time.thread_time() - start < 0.3:
            sess.run(None, feed[k])
            count += 1
        per_run[k] = (time.thread_time() - start) / count
    reps = max(1, int(np.ceil(SAMPLE_CPU_S / min(per_run.values()))))
    samples = {k: [] for k in sessions}
    keys = list(sessions)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            start = time.thread_time()
            for _ in range(reps):
                sessions[k].run(None, feed[k])
            samples[k].append((time.thread_time() - start) / reps * 1e6)
    out = {}
    for k, xs in samples.items():
        ratios = sorted(x / a for x, a in zip(xs, samples["a"]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        out[k] = (statistics.median(xs), statistics.median(ratios), q[0], q[2])
    return out


def check(models: dict[str, onnx.ModelProto], feeds: dict) -> float:
    ref = None
    worst = 0.0
    for k, m in models.items():
        sess = make_session(m, level="disabled")
        y = sess.run([sess.get_outputs()[0].name], {i.name: feeds[i.name] for i in sess.get_inputs()})[0]
        ref = y if ref is None else ref
        worst = max(worst, float(np.abs(y - ref).max()))
    return worst


def row(label: str, level: str, result: dict, peaks: dict | None = None) -> str:
    cells = [f"{result['a'][0]:.0f}"]
    for k, (us, ratio, lo, hi) in result.items():
        if k == "a":
            continue
        cells.append(f"{us:.0f} / {ratio:.3f} [{lo:.3f}, {hi:.3f}]")
    peak = "" if peaks is None else " | " + " / ".join(f"{v / 2**20:.2f}" for v in peaks.values())
    return f"| {label} | {level} | " + " | ".join(cells) + peak + " |"


def peaks_of(models: dict, dims: dict) -> dict:
    out = {}
    for k, m in models.items():
        r = measure_peak(m, dims=dims, int_ranges=INT_RANGES)
        out[k] = r.peak_bytes if getattr(r, "peak_bytes", None) is not None else float("nan")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--micro", action="store_true")
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--levels", default="disabled,all")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--no-peak", action="store_true")
    parser.add_argument("--parts", default="attention,embedding")
    args = parser.parse_args()
    levels = args.levels.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    if args.micro and "attention" in args.parts:
        print("| attention H/heads, B, S | level | (a) MHA us | a again: us / ratio [p25, p75] | (b) Attention "
              "attention_bias | (b') Attention mask_index | peak MiB a / b / b' |")
        print("|---|---|---:|---|---|---|---|")
        for hidden, heads in ((256, 4), (768, 12)):
            for b in batches:
                models = {"a": attention_micro("mha", hidden, heads), "b": attention_micro("bias", hidden, heads),
                          "b'": attention_micro("index", hidden, heads)}
                feeds = feeds_for(models["a"], b, 128, hidden)
                feeds_idx = dict(feeds, mask=(feeds["mask"][:, 0, 0] == 0).astype(np.int32))
                diff = max(check({"a": models["a"], "b": models["b"]}, feeds), _index_diff(models, feeds, feeds_idx))
                peaks = None if args.no_peak else peaks_of(models, {"B": b, "S": 128})
                for level in levels:
                    res = interleaved({k: v for k, v in models.items() if k != "b'"}, feeds, level, args.rounds)
                    res.update(_index_cell(models, feeds, feeds_idx, level, args.rounds))
                    print(row(f"{hidden}/{heads}, {b}, 128", level, res, peaks), f"max|b-a| {diff:.1e}", flush=True)
    if args.micro and "embedding" in args.parts:
        print("| embedding H, B, S | level | (a) decomposed us | a again | (b) EmbedLayerNormalization "
              "| peak MiB a / b |")
        print("|---|---|---:|---|---|---|")
        for hidden in (256, 768):
            for b in batches:
                models = {"a": embedding_micro("decomposed", hidden), "b": embedding_micro("fused", hidden)}
                feeds = feeds_for(models["b"], b, 128)
                diff = check(models, feeds)
                peaks = None if args.no_peak else peaks_of(models, {"B": b, "S": 128})
                for level in levels:
                    res = interleaved(models, feeds, level, args.rounds)
                    print(row(f"{hidden}, {b}, 128", level, res, peaks), f"max|b-a| {diff:.1e}", flush=True)
    for path in args.models or ():
        base = onnx.load(path)
        models = {"a": base, "b": packed(base), "c": embedded(base), "b+c": embedded(packed(base))}
        counts = {k: sum(n.op_type in ("Attention", "EmbedLayerNormalization") for n in m.graph.node)
                  for k, m in models.items()}
        print(f"\n{path}: fused nodes {counts}; nodes {[len(m.graph.node) for m in models.values()]}")
        print("| model, B, S | level | (a) fuse us | a again | (b) packed Attention | (c) EmbedLayerNorm | (b+c) | "
              "peak MiB a / b / c / b+c |")
        print("|---|---|---:|---|---|---|---|---|")
        for b in batches:
            feeds = feeds_for(base, b, 128)
            diff = check(models, feeds)
            peaks = None if args.no_peak else peaks_of(models, {"batch": b, "sequence": 128})
            for level in levels:
                res = interleaved(models, feeds, level, args.rounds)
                print(row(f"{Path(path).stem}, {b}, 128", level, res, peaks), f"max|x-a| {diff:.1e}", flush=True)


def _index_diff(models, feeds, feeds_idx) -> float:
    a, b = (make_session(models[k], level="disabled") for k in ("a", "b'"))
    return float(np.abs(a.run(None, feeds)[0] - b.run(None, feeds_idx)[0]).max())


def _index_cell(models, feeds, feeds_idx, level, rounds) -> dict:
    """(b') against (a) in its own interleaving: its mask input differs from (a)'s."""
    sessions = {"a": make_session(models["a"], level=level, threads=1),
                "b'": make_session(models["b'"], level=level, threads=1)}
    feed = {"a": feeds, "b'": feeds_idx}
    for k, s in sessions.items():
        for _ in range(3):
            s.run(None, feed[k])
    start = time.thread_time()
    sessions["a"].run(None, feeds)
    reps = max(1, int(np.ceil(SAMPLE_CPU_S / max(time.thread_time() - start, 1e-6))))
    samples = {k: [] for k in sessions}
    for r in range(rounds):
        for k in (("a", "b'") if r % 2 == 0 else ("b'", "a")):
            start = time.thread_time()
            for _ in range(reps):
                sessions[k].run(None, feed[k])
            samples[k].append((time.thread_time() - start) / reps * 1e6)
    ratios = sorted(x / a for x, a in zip(samples["b'"], samples["a"]))
    q = statistics.quantiles(ratios, n=4)
    return {"b'": (statistics.median(samples["b'"]), statistics.median(ratios), q[0], q[2])}


if __name__ == "__main__":
    main()
