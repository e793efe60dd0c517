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
table; the forms it refuses are named in the notes here. The rows of both tables, and of SLOWER and
UNCHECKED, are kept in each operator's record (fuse_cli/ops/); this module is the policy over them.
"""

from __future__ import annotations

import numpy as np
from onnx import defs, helper

from fuse_cli.core.domains import is_default_domain
from fuse_cli.kernel_contracts import refused_forms
from fuse_cli.ops import OPERATORS
from fuse_cli.ops.record import MS, Capability, Slower, Unchecked

TARGETS = ("onnx", "ort", "ort-cpu", "ort-cuda")
PROVIDERS_OF: dict[str, tuple[str, ...]] = {
    "onnx": (), "ort": ("cpu", "cuda"), "ort-cpu": ("cpu",), "ort-cuda": ("cuda",)}
PROVIDER_NAMES = {"cpu": "CPU", "cuda": "CUDA"}
DTYPES = ("float32", "float16", "bfloat16", "float64")  # the floating types the table speaks for, in display order

CAPABILITIES: tuple[Capability, ...] = tuple(r.support for r in OPERATORS if r.support and not r.standard)
_BY_KEY = {(c.op, c.domain): c for c in CAPABILITIES}


# Standard operators newer than onnxruntime's fused ones, where what the CPU provider runs depends
# on the dtype. `--target onnx` emits them (its output is verified on onnxruntime's CPU provider);
# the onnxruntime targets get the com.microsoft forms (rotary-embedding, group-query-attention,
# cached-attention, simplified-layer-norm). Measured with one-node sessions at graph optimization
# disabled, onnxruntime-gpu 1.31.1 (the build pyproject installs on Linux x86_64; its CPU provider)
# and onnxruntime 1.32.0 (CPU build): both alike (benchmarks/opset23_probe.py). "cuda" is empty:
# not checked (no GPU at hand), and UNCHECKED says so for targets that promise CUDA.
STANDARD: tuple[Capability, ...] = tuple(r.support for r in OPERATORS if r.support and r.standard)
_STANDARD_BY_OP = {c.op: c for c in STANDARD}

# Kernels that run, measured slower than what they would replace (ops.record.Slower).
SLOWER: tuple[Slower, ...] = tuple(s for r in OPERATORS for s in r.slower)

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
        return (f"the dtype is unknown, so fuse cannot tell whether onnxruntime's CPU provider runs {op} "
                f"(target {target})")
    return (f"onnxruntime's CPU provider has no {dtype} {op} kernel (it runs {_names(cap.cpu)}; "
            f"target {target})")


# Forms checked on some providers only (ops.record.Unchecked): every standard operator above on CUDA.
UNCHECKED: tuple[Unchecked, ...] = (
    *(Unchecked(c.op, "cuda", f"the standard {c.op}'s CUDA kernel in the pinned onnxruntime-gpu is not checked by fuse "
                "(no GPU at hand when it was added; target {target}); --target onnx emits it", domain="")
      for c in STANDARD),
    *(u for r in OPERATORS for u in r.unchecked),
)


def slower(target: str, op: str) -> Slower | None:
    """The measurement that says `op` is slower on a provider `target` may run on, if any."""
    return next((s for s in SLOWER if s.op == op and s.provider in PROVIDERS_OF[target]), None)


def emit_reason(target: str, op: str, dtype, domain: str = MS, *, replaced_in_float32: bool = False) -> str | None:
    """Should a pass emit `domain::op` at `dtype` for `target`? None, or why not: no kernel
    (`target_reason`), a measured slowdown, or a form not checked on one of its providers.

    `replaced_in_float32`: the CPU provider runs all the arithmetic of the float16 nodes the
    rewrite replaces in float32, between Casts it inserts (ops.cpu_float16.computes_in_float32_on_cpu).
    A float16 node of an operator with only a float32 CPU kernel then runs as they ran, between
    such Casts, and may be emitted where the CPU is the only provider without a float16 kernel:
    the peak guard's estimate replays those Casts (analysis/inserted_casts.py) and verification
    checks the outputs. An operator the CPU would run as its function body at float16 instead
    (FLOAT16_BODY_ON_CPU) is emitted where the CPU is the target's only provider, inside Casts
    fuse writes itself (`runs_in_float32_island`). Measured on the float16 decoder corpus:
    benchmarks/results/decoder_fusions_fp16.md (what fuses) and llm_fp16.md (latency and peak
    against the original and the anchors)."""
    reason = target_reason(target, op, dtype, domain)
    if reason is not None and replaced_in_float32 and (runs_between_cpu_casts(target, op, dtype, domain)
                                                       or runs_in_float32_island(target, op, dtype, domain)):
        reason = None
    if reason is None and (measured := slower(target, op)) is not None:
        reason = measured.reason.format(target=target)
    domain = "" if domain == "ai.onnx" else domain
    unchecked = next((u for u in UNCHECKED if (u.op, u.domain) == (op, domain) and u.provider in PROVIDERS_OF[target]),
                     None)
    if reason is None and unchecked is not None:
        reason = unchecked.reason.format(target=target)
    return reason


# Operators the CPU provider runs at float16 by inlining their function body (the elementwise
# nodes a fusion replaces), not through their float32 kernel: nothing fused runs there.
FLOAT16_BODY_ON_CPU = frozenset((r.domain, r.op) for r in OPERATORS if r.float16_body_on_cpu)


def runs_between_cpu_casts(target: str, op: str, dtype, domain: str) -> bool:
    """A float16 `op` the CPU provider runs through its float32 kernel (between Casts it inserts),
    the only provider of `target` without a float16 kernel."""
    return _cpu_float32_route(target, op, dtype, domain) == "casts"


def runs_in_float32_island(target: str, op: str, dtype, domain: str) -> bool:
    """A float16 `op` the CPU provider would run as its function body (FLOAT16_BODY_ON_CPU), on a
    target whose only provider is the CPU: the engine writes Casts to float32 around it and back
    (toolkit/float32_islands.py), so its float32 kernel runs. Not on `ort`: CUDA's float16 kernel
    would then run in float32 too."""
    return _cpu_float32_route(target, op, dtype, domain) == "island"


def _cpu_float32_route(target: str, op: str, dtype, domain: str) -> str | None:
    """How a float16 `op` whose only missing kernel on `target` is the CPU's float16 one runs in
    float32 there: "casts" the provider inserts around its float32 kernel, an "island" of Casts
    fuse writes (an operator it would inline as its body; the CPU the target's only provider), or
    None (not float16, no float32 CPU kernel, another provider missing one)."""
    domain = "" if domain == "ai.onnx" else domain
    cap = capability(op, domain)
    if (cap is None or dtype is None or dtype_name(dtype) != "float16" or "float32" not in cap.cpu
            or _missing(cap, target, "float16") != ["cpu"]):
        return None
    if (domain, op) not in FLOAT16_BODY_ON_CPU:
        return "casts"
    return "island" if target in targets_of_provider_alone("cpu") else None


def targets_of_provider_alone(provider: str) -> frozenset[str]:
    """The targets whose only provider is `provider` ("cpu": ort-cpu)."""
    return frozenset(t for t in TARGETS if PROVIDERS_OF[t] == (provider,))


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
        refused = [f"not emitted: {reason}"
                   for reason in dict.fromkeys(c.refused for c in refused_forms(cap.op, cap.domain))]
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
