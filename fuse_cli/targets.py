"""Target policy, in one place: which onnxruntime fused operators each `--target` may emit
(operator x provider x dtype, CAPABILITIES), and where a kernel that runs was measured slower
than what it replaces (SLOWER, with the evidence). Passes declare the operators they emit; the
registry keeps a pass only in the pipelines of targets that can run them (`usable_targets`),
and the engine asks `emit_reason` once per match.

`--target onnx` emits standard operators only. The onnxruntime targets may also emit the
operators below, but only where the providers they promise to run on have a kernel for the
model's dtype: `ort` needs both the CPU and the CUDA provider, `ort-cpu` and `ort-cuda` one each.

Where the columns come from (onnxruntime 1.31):
- CPU: what the installed onnxruntime really runs. tests/test_targets.py checks every row against
  its kernel registry, or, where that call crashes, by loading a one-node model per dtype. A
  kernel counts only if a model using it loads: SkipLayerNormalization registers a float64 kernel
  that its schema refuses, and onnxruntime's CPU provider wraps float16 nodes that have only a
  float32 kernel in Casts, which is not running in float16.
- CUDA: onnxruntime's docs/OperatorKernels.md; the same test checks it where CUDA really loads
  (run on an H200 with onnxruntime-gpu 1.31.1: every row agreed but NhwcConv, corrected below;
  get_all_opkernel_def() crashed there too, with the CUDA libraries loaded).
Which forms of an operator (optional inputs left empty, dtypes) run correctly is kernel_contracts.py's
table; the forms it refuses are named in the notes here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import defs, helper

from fuse_cli.core.domains import is_default_domain
from fuse_cli.kernel_contracts import refused_forms

TARGETS = ("onnx", "ort", "ort-cpu", "ort-cuda")
PROVIDERS_OF: dict[str, tuple[str, ...]] = {
    "onnx": (), "ort": ("cpu", "cuda"), "ort-cpu": ("cpu",), "ort-cuda": ("cuda",)}
PROVIDER_NAMES = {"cpu": "CPU", "cuda": "CUDA"}
DTYPES = ("float32", "float16", "bfloat16", "float64")  # the floating types the table speaks for, in display order
MS = "com.microsoft"


@dataclass(frozen=True)
class Capability:
    op: str
    domain: str  # "com.microsoft", or "" for the few operators onnxruntime registers in the default domain
    cpu: frozenset[str]  # dtype names it has a kernel for on onnxruntime's CPU provider
    cuda: frozenset[str]
    notes: str = ""  # constraints beyond the dtype, in plain words

    @property
    def qualified(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    def dtypes(self, provider: str) -> frozenset[str]:
        return getattr(self, provider)


def _cap(op: str, cpu: str, cuda: str, notes: str = "", domain: str = MS) -> Capability:
    return Capability(op, domain, frozenset(cpu.split()), frozenset(cuda.split()), notes)


_GELU_FAMILY = "at other dtypes the CPU provider expands it back into elementwise ops: nothing is fused"
CAPABILITIES: tuple[Capability, ...] = (
    _cap("FusedConv", "float32", "float32",
         "activation: CPU takes Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid; "
         "CUDA only Relu (recent builds also Tanh)"),
    _cap("FusedGemm", "float32", "", "no CUDA kernel"),
    _cap("FusedMatMul", "float32 float64", "float32 float16 bfloat16 float64"),
    _cap("SkipLayerNormalization", "float32 float16 bfloat16", "float32 float16 bfloat16",
         "epsilon defaults to 1e-12, not LayerNormalization's 1e-5: always set it"),
    _cap("SkipSimplifiedLayerNormalization", "float32 float16 bfloat16", "float32 float16 bfloat16",
         "epsilon defaults to 1e-12: always set it"),
    _cap("SimplifiedLayerNormalization", "float32 float16 bfloat16 float64", "float32 float16 bfloat16 float64",
         "default domain but not standard ONNX (onnx.checker rejects it); "
         "the standard form is RMSNormalization, opset 23",
         domain=""),
    _cap("Gelu", "float32", "float32 float16 bfloat16 float64", _GELU_FAMILY),
    _cap("BiasGelu", "float32", "float32 float16 bfloat16 float64"),
    _cap("FastGelu", "float32", "float32 float16 bfloat16 float64", _GELU_FAMILY),
    _cap("QuickGelu", "float32", "float32 float16 bfloat16 float64", _GELU_FAMILY),
    _cap("Attention", "float32", "float32 float16 bfloat16",
         "num_heads required; packed QKV weights [hidden, q+k+v] and bias; the graph's mask as attention_bias. CPU "
         "time 0.91-0.97x the Q/K/V MatMuls + MultiHeadAttention it replaces (packed-attention; "
         "benchmarks/results/bert_packed_attention.md)"),
    _cap("EmbedLayerNormalization", "float32", "float32 float16",
         "int32 ids only (int64 exports need Casts); no pass emits it: measured slower on the CPU (SLOWER)"),
    _cap("MultiHeadAttention", "float32", "float32 float16 bfloat16", "num_heads required"),
    _cap("GroupQueryAttention", "float32 float16", "float16 bfloat16",
         "head size % 8 == 0 on CPU; num_heads and kv_num_heads required; seqlens_k [B] int32 and "
         "total_sequence_length int32 inputs. With causal=0 and attention_bias (the graph's own mask) the 1.31 CPU "
         "kernel equals softmax(QK^T*scale + bias)V over repeat_kv'd K/V, fully masked rows included "
         "(one-node check, 2026-12-01); CUDA with causal=0 unverified: group-query-attention declines there. With "
         "past_key/past_value given the CPU kernel refuses batch > 1 when sequence > 1 (1.31.1: \"batch_size must "
         "be 1 when sequence_length > 1 and past context is given\", one-node check): a decode step with the "
         "cache (cached-attention) goes to MultiHeadAttention, which takes any batch and step length"),
    _cap("RotaryEmbedding", "float32 float16", "float32 float16 bfloat16",
         "inputs (input, position_ids, cos, sin): not the order of the standard opset-23 RotaryEmbedding. input "
         "[B, S, H*d] (with num_heads) or [B, H, S, d]; position_ids [1] (row start + s) or [B, S]; caches "
         "[rows, d/2]: rotary-embedding passes the graph's own per-position cos/sin rows with position_ids [0], so "
         "no table of max positions is built"),
    _cap("BiasAdd", "", "float32 float16", "CUDA only"),
    _cap("BiasSplitGelu", "", "float32 float16", "CUDA only"),
    _cap("BiasSoftmax", "", "float32 float16 float64", "CUDA only"),
    # docs/OperatorKernels.md lists float32 and float16 on CUDA, but onnxruntime-gpu 1.31.1 on an
    # H200 ran no one-node NhwcConv model (tests/test_targets.py's probe, 2026-11-29)
    _cap("NhwcConv", "", "", "listed for CUDA in onnxruntime's docs, but its 1.31.1 wheel ran none; no pass emits it"),
    _cap("GroupNorm", "", "float32 float16", "CUDA only; NHWC layout"),
    _cap("SkipGroupNorm", "", "float32 float16", "CUDA only; NHWC layout"),
    _cap("GemmFastGelu", "", "", "ROCm only: neither the CPU nor the CUDA provider has it"),
)
_BY_KEY = {(c.op, c.domain): c for c in CAPABILITIES}



# Standard operators newer than onnxruntime's fused ones, where what the CPU provider runs depends
# on the dtype. `--target onnx` emits them (its output is verified on onnxruntime's CPU provider);
# the onnxruntime targets get the com.microsoft forms (rotary-embedding, group-query-attention,
# cached-attention, simplified-layer-norm). Measured with one-node sessions at graph optimization
# disabled, onnxruntime-gpu 1.31.1 (the build pyproject installs on Linux x86_64; its CPU provider)
# and onnxruntime 1.32.0 (CPU build): both alike (benchmarks/opset23_probe.py). "cuda" is empty:
# not checked (no GPU at hand), and UNCHECKED says so for targets that promise CUDA.
STANDARD: tuple[Capability, ...] = (
    _cap("RMSNormalization", "float32 float16 float64", "",
         "opset 23; bfloat16 not probed; rms-norm emits it for float32 only. CPU time 0.61-0.95x the decomposed "
         "form in decoder exports (benchmarks/results/opset23.md)", domain=""),
    _cap("RotaryEmbedding", "float32 float16", "",
         "opset 23; inputs (X, cos_cache, sin_cache, position_ids?); float64: the schema refuses it. Without "
         "position_ids the caches must be [B, S, d/2] of x's own batch: a batch-1 cache for batch 2 fails at run time "
         "(\"Inputs 'cos_cache' and 'sin_cache' are expected to have the same shape as input 'x', got 1 and 5\"). CPU time "
         "0.83-0.95x the decomposed form, 1.02x on two 128-token prefills (within the shared CPU's noise: not declined; "
         "benchmarks/results/opset23.md)",
         domain=""),
    _cap("Attention", "float32 float16", "",
         "opset 23; Q, K, V all 3-D (q_num_heads, kv_num_heads) or all 4-D: 3-D Q with 4-D K/V fails at run time "
         "(attention_helper.h:39 ComputeOutputShapeForAttention). float64 loads but runs as the function body "
         "(60 elementwise nodes), not a kernel. An attn_mask [B, 1, 1, T] (padding only, broadcast over the queries) fails at run time "
         "(attention_helper.h:98 ComputeOutputShapeForAttention); [B or 1, 1 or H, S, T] runs. CPU time 0.66-0.96x the decomposed "
         "form (benchmarks/results/opset23.md). onnxruntime also runs present outputs without past inputs, which "
         "the standard forbids: fuse never emits that",
         domain=""),
)
_STANDARD_BY_OP = {c.op: c for c in STANDARD}


@dataclass(frozen=True)
class Slower:
    """A kernel a provider runs, measured slower than the operators it would replace. `op` names
    an operator, or one form of it as `op:attribute` (the pass that emits the form asks).

    `reason` is the near-miss text ({target} is the target's name). With `leaves_pipeline` the
    passes emitting `op` are not in the pipelines of targets that use `provider` at all (nothing
    to report: the unfused form is simply what that target runs)."""

    op: str
    provider: str
    reason: str
    evidence: str
    leaves_pipeline: bool = False


SLOWER: tuple[Slower, ...] = (
    Slower("FusedConv", "cuda",
           "onnxruntime-gpu 1.31's CUDA FusedConv measured 1.8-2.5x slower than the Conv and activation it replaces "
           "(resnet50, inception_v2 on an H200) (target {target}); --target ort-cpu fuses it",
           "NVIDIA H200, onnxruntime-gpu 1.31.1, batch 1 (fuse bench --provider CUDA, against the same model with "
           "its BatchNormalizations folded): light_resnet50 1.87x at graph optimization disabled and 2.08x at all; "
           "light_inception_v2 1.79x and 2.47x. The same folds without FusedConv (--target onnx) ran 0.92x and 0.70x."),
    Slower("BiasGelu", "cpu",
           "onnxruntime's CPU BiasGelu measured 1.04-1.28x slower than the Add + Gelu it would replace, so the bias "
           "Add stays (target {target}; --target ort-cuda fuses it)",
           "onnxruntime 1.31, profiler kernel time, one thread, fp32, graph optimizations off. After a MatMul, 200 "
           "runs: [1, 128, 3072] 262-272 vs 210-216 us, [1, 197, 3072] 417 vs 333-352 us, [1, 1024, 3072] "
           "2205-2214 vs 1866-1960 us. Its 12 nodes in real exports, us a run: bert-base dynamo 2988-3423 vs "
           "2445-2796, vit-base dynamo 4650-4768 vs 3894-3966, vit-base opset 17 4558-4798 vs 3622-3844, "
           "bert-base opset 17 2410-2513 vs 2321-2400."),
    Slower("EmbedLayerNormalization", "cpu",
           "onnxruntime 1.31's CPU EmbedLayerNormalization measured 1.39-1.55x slower than BERT's word + position + "
           "segment Gathers, Adds and LayerNormalization it would replace (target {target})",
           "benchmarks/bert_packed_attention.py, one thread, fp32, 21 interleaved rounds, at graph optimization "
           "disabled and all alike, Casts of the int64 ids to int32 included: hidden 256 [1, 128] 46 vs 32 us (1.43-1.45x), "
           "[8, 128] 334-345 vs 220-229 us (1.50-1.52x); hidden 768 [1, 128] 125 vs 90 us (1.39x), [8, 128] 977-1041 vs "
           "630-731 us (1.43-1.55x); a second session of the decomposed form within 0.993-1.014x. In fuse's ort-cpu "
           "output of the corpus's bert-small and bert-base (opset 14) 1.00-1.02x at disabled, 1.08-1.20x at all, and "
           "a higher measured peak (1.43 -> 2.33 MiB, 4.14 -> 7.21 MiB at batch 1) (benchmarks/results/"
           "bert_packed_attention.md).",
           leaves_pipeline=True),
    *(Slower(f"{op}:softcap", "cpu",
             f"onnxruntime 1.31's CPU {op} with a soft cap measured 1.5-2.0x the decomposed attention's time "
             f"(its softcap pass costs 5x the rest of the kernel; target {{target}})",
             "gemma2 prefill (the decoder corpus, 2 layers, 4 heads of 32), batch 1 x 128, one thread, 50 runs: "
             "the original 1.06-1.09 ms at graph optimization disabled and 0.80-0.82 at all; fuse's output with "
             "GroupQueryAttention(softcap) 1.59-1.63 and 1.59-1.63 (benchmarks/llm_bench.py: 1.42 / 1.98 opset 17, "
             "1.74 / 1.88 dynamo); the same nodes without the softcap attribute 0.70 and 0.73; the standard "
             "Attention (opset 23) with softcap 1.62 and 1.59, the decomposed form at opset 23 0.76 and 0.73.")
      for op in ("GroupQueryAttention", "Attention")),
    *(Slower(op, "cpu", f"onnxruntime 1.31's CPU {op} measured 6.6x slower than the unfused Adds and norm",
             "390 vs 59 us at [1, 128, 768], one thread, against the Add + Add + LayerNormalization it replaces; "
             "onnxruntime's own optimizer makes the same fusion at level all (see api._run_level_note)",
             leaves_pipeline=True)
      for op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")),
)

_DTYPE_ALIASES = {"float": "float32", "fp32": "float32", "half": "float16", "fp16": "float16", "bf16": "bfloat16",
                  "double": "float64", "fp64": "float64"}


def capability(op: str, domain: str = MS) -> Capability | None:
    return _BY_KEY.get((op, "" if domain == "ai.onnx" else domain))


def dtype_name(dtype) -> str:
    """"float16" from np.float16, np.dtype("float16"), "fp16", "half" or onnx.TensorProto.FLOAT16."""
    if isinstance(dtype, str):
        name = dtype.lower()
        return _DTYPE_ALIASES.get(name, name)
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(dtype))).name
    return np.dtype(dtype).name


def target_reason(target: str, op: str, dtype, domain: str = MS) -> str | None:
    """None if every provider of `target` runs `op` at `dtype`, else why not, in plain words.
    `dtype` is anything `dtype_name` reads, or None when unknown (then only standard operators pass).

    Standard ONNX operators are allowed everywhere: what this table knows is which non-standard
    operators onnxruntime's providers implement. Operators it does not know are refused."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    domain = "" if domain == "ai.onnx" else domain
    cap = capability(op, domain)
    qualified = cap.qualified if cap else (f"{domain}::{op}" if domain else op)
    if cap is None:
        if domain == "" and op in _STANDARD_BY_OP:
            return standard_reason(op, dtype, target)
        if domain == "":
            return None if _is_standard(op) else f"{op} is not an ONNX operator (target {target})"
        return (f"{qualified} is not in fuse's table of onnxruntime operators, so no target may emit it "
                f"(target {target})")
    dtype = None if dtype is None else dtype_name(dtype)
    if target == "onnx":
        hint = next((t for t in TARGETS[1:] if dtype and _missing(cap, t, dtype) == []), None)
        return f"{qualified} is not a standard ONNX operator (target onnx)" + (f"; use --target {hint}" if hint else "")
    if dtype is None:
        where = " and ".join(PROVIDER_NAMES[p] for p in PROVIDERS_OF[target])
        providers = "providers run" if len(PROVIDERS_OF[target]) > 1 else "provider runs"
        return (f"the dtype is unknown, so fuse cannot tell whether onnxruntime's {where} {providers} {op} "
                f"(target {target})")
    missing = _missing(cap, target, dtype)
    if not missing:
        return None
    where = " or ".join(PROVIDER_NAMES[p] for p in missing)
    plural = "s" if len(missing) > 1 else ""
    if all(not cap.dtypes(p) for p in missing):
        reason = f"{op} has no kernel on onnxruntime's {where} provider{plural} (target {target})"
    else:
        reason = f"{op} has no {dtype} kernel on onnxruntime's {where} provider{plural} (target {target})"
    other = [t for t in TARGETS[1:] if t != target and _missing(cap, t, dtype) == []]
    return reason + (f"; --target {other[0]} allows it" if other else "")


def standard_reason(op: str, dtype, target: str) -> str | None:
    """None if onnxruntime's CPU provider (which verifies every target's output) runs the standard
    `op` at `dtype` as a kernel, else why not."""
    dtype = None if dtype is None else dtype_name(dtype)
    cap = _STANDARD_BY_OP[op]
    if dtype in cap.cpu:
        return None
    if dtype is None:
        return f"the dtype is unknown, so fuse cannot tell whether onnxruntime's CPU provider runs {op} (target {target})"
    return (f"onnxruntime's CPU provider has no {dtype} {op} kernel (it runs {_names(cap.cpu)}; "
            f"target {target})")


@dataclass(frozen=True)
class Unchecked:
    """A kernel a provider has, for a form fuse emits that was checked on other providers only
    (no machine with that provider at hand): declined there until someone checks it."""

    op: str
    provider: str
    reason: str
    domain: str = MS  # "" for a standard operator


UNCHECKED: tuple[Unchecked, ...] = (
    *(Unchecked(c.op, "cuda", f"the standard {c.op}'s CUDA kernel in the pinned onnxruntime-gpu is not checked by fuse "
                "(no GPU at hand when it was added; target {target}); --target onnx emits it", domain="")
      for c in STANDARD),
    Unchecked("Attention", "cuda",
              "the packed-QKV Attention was measured faster than the Q/K/V MatMuls and MultiHeadAttention on "
              "onnxruntime's CPU provider only (target {target}); --target ort-cpu fuses it"),
    Unchecked("GroupQueryAttention", "cuda",
              "GroupQueryAttention with causal=0 and an attention_bias is verified on onnxruntime's CPU provider "
              "only (target {target}); --target ort-cpu fuses it"),
)


def slower(target: str, op: str) -> Slower | None:
    """The measurement that says `op` is slower on a provider `target` may run on, if any."""
    return next((s for s in SLOWER if s.op == op and s.provider in PROVIDERS_OF[target]), None)


def emit_reason(target: str, op: str, dtype, domain: str = MS) -> str | None:
    """Should a pass emit `domain::op` at `dtype` for `target`? None, or why not: no kernel
    (`target_reason`), a measured slowdown, or a form not checked on one of its providers."""
    reason = target_reason(target, op, dtype, domain)
    if reason is None and (measured := slower(target, op)) is not None:
        reason = measured.reason.format(target=target)
    domain = "" if domain == "ai.onnx" else domain
    unchecked = next((u for u in UNCHECKED if (u.op, u.domain) == (op, domain) and u.provider in PROVIDERS_OF[target]),
                     None)
    if reason is None and unchecked is not None:
        reason = unchecked.reason.format(target=target)
    return reason


def usable_targets(emits: tuple[str, ...]) -> frozenset[str]:
    """The targets a pass emitting `emits` ("domain::op", or "op" for the default domain) belongs
    to: standard operators everywhere; others where every provider of the target has a kernel at
    some dtype and no measurement takes the pass out of that target's pipeline."""
    usable = set(TARGETS)
    for qualified in emits:
        domain, _, op = qualified.rpartition("::")
        if _is_standard(op) and is_default_domain(domain):
            continue
        cap = capability(op, domain)
        usable -= {t for t in TARGETS if t == "onnx" or cap is None
                   or not any(_missing(cap, t, d) == [] for d in DTYPES)
                   or any(s.leaves_pipeline for s in SLOWER if s.op == op and s.provider in PROVIDERS_OF[t])}
    return frozenset(usable)


def capability_rows(target: str) -> list[tuple[str, ...]]:
    """One row per operator: op, domain, CPU dtypes, CUDA dtypes, usable with `target`, notes."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    rows = []
    for cap in CAPABILITIES:
        if target == "onnx":
            usable = "no (not standard ONNX)"
        else:
            usable = _names(d for d in DTYPES if _missing(cap, target, d) == []) or "no"
        refused = [f"not emitted: {reason}" for reason in dict.fromkeys(c.refused for c in refused_forms(cap.op, cap.domain))]
        notes = "; ".join(filter(None, [cap.notes, *refused]))
        rows.append((cap.op, cap.domain or "(default)", _names(cap.cpu) or "none", _names(cap.cuda) or "none",
                     usable, notes))
    return rows


CAPABILITY_HEADERS = ("operator", "domain", "CPU", "CUDA", "usable", "notes")


def _missing(cap: Capability, target: str, dtype: str) -> list[str]:
    return [p for p in PROVIDERS_OF[target] if dtype not in cap.dtypes(p)]


def _names(dtypes) -> str:
    chosen = set(dtypes)
    return ", ".join(d for d in DTYPES if d in chosen)


def _is_standard(op: str) -> bool:
    return defs.has(op, "")
