"""One-node probes of the opset-23 standard operators fuse emits (RMSNormalization, RotaryEmbedding,
Attention) in the installed onnxruntime's CPU provider, each checked against numpy: which forms
and dtypes run as a kernel (the node stays alone in the optimized model), which fail and how.
What it printed for onnxruntime-gpu 1.31.1 and onnxruntime 1.32.0 is in fuse_cli/targets.py's
STANDARD table.

    python benchmarks/opset23_probe.py"""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, TensorProto as TP
print("onnxruntime", ort.__version__, ort.__file__)
DT = {"float32": TP.FLOAT, "float16": TP.FLOAT16, "float64": TP.DOUBLE}  # bfloat16: numpy has none; not probed
NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64}

def run(nodes, inputs, outputs, feeds, opset=23, ir=10):
    g = helper.make_graph(nodes, "p", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    import tempfile
    so.optimized_model_filepath = tempfile.mktemp(suffix=".onnx")
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    return s.run(None, feeds), ops

def vi(name, dt, shape): return helper.make_tensor_value_info(name, DT[dt] if isinstance(dt, str) else dt, shape)

def attempt(label, f):
    try:
        r = f()
        print(f"OK   {label}: {r}")
    except Exception as e:
        print(f"FAIL {label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")

rng = np.random.default_rng(0)
# RMSNormalization
for dt in DT:
    def f(dt=dt):
        x = rng.standard_normal((2, 3, 8)).astype(NP[dt])
        s = rng.standard_normal(8).astype(NP[dt])
        (y,), ops = run([helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-6)],
                        [vi("x", dt, [2, 3, 8]), vi("s", dt, [8])], [vi("y", dt, None)], {"x": x, "s": s})
        x = x.astype(np.float64)
        ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * s
        return f"maxdiff {np.abs(y.astype(np.float64) - ref).max():.2e} ops {ops}"
    attempt(f"RMSNormalization {dt}", f)
# axis=-2 float32
def f():
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    s = rng.standard_normal((3, 8)).astype(np.float32)
    (y,), ops = run([helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-2, epsilon=1e-6)],
                    [vi("x", "float32", [2, 3, 8]), vi("s", "float32", [3, 8])], [vi("y", "float32", None)],
                    {"x": x, "s": s})
    ref = x / np.sqrt((x * x).mean((-2, -1), keepdims=True) + 1e-6) * s
    return f"maxdiff {np.abs(y - ref).max():.2e} ops {ops}"
attempt("RMSNormalization axis=-2 float32", f)

def rope_ref(x4, cos, sin, interleaved=False, rdim=None):  # x4 [B,H,S,d], cos/sin [B,S,r/2]
    d = x4.shape[-1]
    r = rdim or d
    xr, xp = x4[..., :r], x4[..., r:]
    c = cos[:, None]
    s = sin[:, None]
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = np.empty_like(xr)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = b * c + a * s
    else:
        a, b = xr[..., :r // 2], xr[..., r // 2:]
        out = np.concatenate([a * c - b * s, b * c + a * s], -1)
    return np.concatenate([out, xp], -1)

B, H, S, d = 2, 3, 5, 8
for dt in ("float32", "float16", "float64"):
    for form in ("4d-nopos-3dcache", "4d-pos-2dcache", "3d-nopos-3dcache", "3d-pos-2dcache", "4d-nopos-bcastcache",
                 "4d-partial-3dcache", "4d-interleaved"):
        def f(dt=dt, form=form):
            npd = NP[dt]
            x4 = rng.standard_normal((B, H, S, d)).astype(npd)
            rdim = d // 2 if "partial" in form else d
            ang = rng.standard_normal((B, S, rdim // 2))
            cos, sin = np.cos(ang).astype(npd), np.sin(ang).astype(npd)
            attrs = {}
            if "partial" in form:
                attrs["rotary_embedding_dim"] = rdim
            if "interleaved" in form:
                attrs["interleaved"] = 1
            ins = ["x", "cos", "sin"]
            feeds = {}
            if "3d-" in form[:3]:
                x = x4.transpose(0, 2, 1, 3).reshape(B, S, H * d)
                attrs["num_heads"] = H
            else:
                x = x4
            if "pos" in form and "nopos" not in form:
                pos = rng.permutation(S * B).reshape(B, S).astype(np.int64) % (S * B)
                table = rng.standard_normal((S * B, d // 2))
                ct, st = np.cos(table).astype(npd), np.sin(table).astype(npd)
                cos, sin = ct[pos], st[pos]
                feeds = {"x": x, "cos": ct, "sin": st, "pos": pos}
                ins.append("pos")
                cin = [vi("cos", dt, list(ct.shape)), vi("sin", dt, list(st.shape)), vi("pos", TP.INT64, [B, S])]
            elif "bcast" in form:
                cos, sin = cos[:1], sin[:1]
                feeds = {"x": x, "cos": cos, "sin": sin}
                cin = [vi("cos", dt, list(cos.shape)), vi("sin", dt, list(sin.shape))]
                cos, sin = np.broadcast_to(cos, (B, S, rdim // 2)), np.broadcast_to(sin, (B, S, rdim // 2))
            else:
                feeds = {"x": x, "cos": cos, "sin": sin}
                cin = [vi("cos", dt, list(cos.shape)), vi("sin", dt, list(sin.shape))]
            (y,), ops = run([helper.make_node("RotaryEmbedding", ins, ["y"], **attrs)],
                            [vi("x", dt, list(x.shape)), *cin],
                            [vi("y", dt, None)], feeds)
            ref = rope_ref(x4.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64),
                           "interleaved" in form, rdim)
            if "3d-" in form[:3]:
                y = y.reshape(B, S, H, d).transpose(0, 2, 1, 3)
            return f"maxdiff {np.abs(y.astype(np.float64) - ref).max():.2e} ops {ops}"
        attempt(f"RotaryEmbedding {form} {dt}", f)

def softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)
def attn_ref(q4, k4, v4, mask=None, causal=False, past=0):
    H, KV = q4.shape[1], k4.shape[1]
    k4 = np.repeat(k4, H // KV, 1)
    v4 = np.repeat(v4, H // KV, 1)
    s = q4 @ k4.transpose(0, 1, 3, 2) / np.sqrt(q4.shape[-1])
    if mask is not None:
        s = s + mask
    if causal:
        S, T = s.shape[-2:]
        allowed = np.arange(T)[None, :] <= np.arange(S)[:, None] + (T - S)
        s = np.where(allowed, s, -np.inf)
    return softmax(s) @ v4

for dt in ("float32", "float16", "float64"):
    for form in ("3d-gqa-mask", "3d-gqa-causal", "3d-gqa-past-causal", "3d-gqa-past-mask", "4d-gqa-mask",
                 "4d-gqa-past-mask", "3d-mha-mask", "3dq-4dkv-mask", "3d-gqa-boolmask"):
        def f(dt=dt, form=form):
            npd = NP[dt]
            Bz, H, KV, S, P, d = 2, 4, 2, 3, 5 if "past" in form else 0, 8
            if "mha" in form:
                KV = H
            q4 = rng.standard_normal((Bz, H, S, d)).astype(npd)
            k4 = rng.standard_normal((Bz, KV, S, d)).astype(npd)
            v4 = rng.standard_normal((Bz, KV, S, d)).astype(npd)
            pk = rng.standard_normal((Bz, KV, P, d)).astype(npd)
            pv = rng.standard_normal((Bz, KV, P, d)).astype(npd)
            T = P + S
            mask = None
            attrs = {}
            def to3(t):
                return t.transpose(0, 2, 1, 3).reshape(t.shape[0], t.shape[2], -1)

            if form.startswith("3d-"):
                q, k, v = to3(q4), to3(k4), to3(v4)
                attrs.update(q_num_heads=H, kv_num_heads=KV)
            elif form.startswith("3dq"):
                q, k, v = to3(q4), k4, v4
                attrs.update(q_num_heads=H, kv_num_heads=KV)
            else:
                q, k, v = q4, k4, v4
            ins = ["q", "k", "v"]
            feeds = {"q": q, "k": k, "v": v}
            vis = [vi("q", dt, list(q.shape)), vi("k", dt, list(k.shape)), vi("v", dt, list(v.shape))]
            if "mask" in form:
                if "bool" in form:
                    mb = rng.random((Bz, 1, S, T)) > 0.3
                    mb[..., 0] = True
                    mask = np.where(mb, 0, -np.inf)
                    feeds["m"] = mb
                    vis.append(vi("m", TP.BOOL, [Bz, 1, S, T]))
                else:
                    lowest = -3.4e38 if dt != "float16" else -65504.0
                    mask = np.triu(np.full((S, T), lowest), 1 + P)[None, None].astype(npd)
                    mask = np.broadcast_to(mask, (Bz, 1, S, T)).copy()
                    feeds["m"] = mask
                    vis.append(vi("m", dt, [Bz, 1, S, T]))
                ins.append("m")
            else:
                ins.append("")
            if "causal" in form:
                attrs["is_causal"] = 1
            outs = ["y"]
            ovis = [vi("y", dt, None)]
            if "past" in form:
                ins += ["pk", "pv"]
                feeds.update(pk=pk, pv=pv)
                vis += [vi("pk", dt, list(pk.shape)), vi("pv", dt, list(pv.shape))]
                outs += ["ok", "ov"]
                ovis += [vi("ok", dt, None), vi("ov", dt, None)]
            while ins and ins[-1] == "":
                ins.pop()
            res, ops = run([helper.make_node("Attention", ins, outs, **attrs)], vis, ovis, feeds)
            kf = np.concatenate([pk, k4], 2).astype(np.float64)
            vf = np.concatenate([pv, v4], 2).astype(np.float64)
            ref = attn_ref(q4.astype(np.float64), kf, vf, None if mask is None else mask.astype(np.float64),
                           "causal" in form, P)
            y = res[0]
            if y.ndim == 3:
                y = y.reshape(Bz, S, H, d).transpose(0, 2, 1, 3)
            extra = ""
            if "past" in form:
                extra = (f" present diff {np.abs(res[1] - kf).max():.1e}/{np.abs(res[2] - vf).max():.1e} "
                         f"shape {res[1].shape}")
            return f"maxdiff {np.abs(y.astype(np.float64) - ref).max():.2e}{extra} ops {ops}"
        attempt(f"Attention {form} {dt}", f)

# float32 Attention with an additive mask: a padding-only mask [B, 1, 1, T] (broadcast over the
# queries), and a row masked throughout (the decomposed graph averages V there)
B, H, KV, S, d = 2, 4, 2, 3, 8
q = rng.standard_normal((B, S, H * d)).astype(np.float32)
k, v = (rng.standard_normal((B, S, KV * d)).astype(np.float32) for _ in range(2))
def masked(mask):
    (y,), _ = run([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], q_num_heads=H, kv_num_heads=KV)],
                  [vi("q", "float32", [B, S, H * d]), vi("k", "float32", [B, S, KV * d]),
                   vi("v", "float32", [B, S, KV * d]), vi("m", "float32", list(mask.shape))],
                  [vi("y", "float32", None)], {"q": q, "k": k, "v": v, "m": mask})
    return y
attempt("Attention mask [B, 1, 1, T]", lambda: masked(np.zeros((B, 1, 1, S), np.float32)).shape)
for fill in (-np.inf, np.finfo(np.float32).min, -3e38, -1e30):
    def f(fill=fill):
        mask = np.zeros((B, 1, S, S), np.float32)
        mask[:, :, 0] = fill
        y = masked(mask)[:, 0].reshape(B, H, d)
        mean = v.reshape(B, S, KV, d).mean(1).repeat(H // KV, 1)
        return f"row 0 zeros: {bool(np.all(y == 0))}, row 0 = mean of V: {bool(np.allclose(y, mean, atol=1e-5))}"
    attempt(f"Attention row masked throughout with {fill:g}", f)
