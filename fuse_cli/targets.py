"""Which onnxruntime fused operators each `--target` may emit: operator x provider x dtype.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import defs, helper

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
    _cap("Attention", "float32", "float32 float16 bfloat16", "num_heads required; packed QKV weights"),
    _cap("MultiHeadAttention", "float32", "float32 float16 bfloat16", "num_heads required"),
    _cap("GroupQueryAttention", "float32 float16", "float16 bfloat16",
         "head size % 8 == 0 on CPU; num_heads and kv_num_heads required"),
    _cap("RotaryEmbedding", "float32 float16", "float32 float16 bfloat16",
         "inputs (input, position_ids, cos, sin): not the order of the standard opset-23 RotaryEmbedding"),
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
        rows.append((cap.op, cap.domain or "(default)", _names(cap.cpu) or "none", _names(cap.cuda) or "none",
                     usable, cap.notes))
    return rows


CAPABILITY_HEADERS = ("operator", "domain", "CPU", "CUDA", "usable", "notes")


def _missing(cap: Capability, target: str, dtype: str) -> list[str]:
    return [p for p in PROVIDERS_OF[target] if dtype not in cap.dtypes(p)]


def _names(dtypes) -> str:
    chosen = set(dtypes)
    return ", ".join(d for d in DTYPES if d in chosen)


def _is_standard(op: str) -> bool:
    return defs.has(op, "")
