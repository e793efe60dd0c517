"""Which nodes onnxruntime's CPU provider runs in float16 itself, and which it runs in float32
between Casts it inserts (its InsertCastTransformer, analysis/inserted_casts.py).

The CPU provider has float16 kernels for the operators that move or select data and for a few
normalizations; a float16 node of any other operator (MatMul, Add, Softmax, Relu, ...) gets no
kernel, and onnxruntime then casts its float16 inputs to float32, runs the float32 kernel and
casts the outputs back, even with graph optimizations disabled. Those Casts are tensors the
memory estimate must count: a Cast of a float16 weight holds a float32 copy of it.

Measured on onnxruntime-gpu 1.31.1 (its CPU provider) with one-node float16 models at graph
optimization disabled: a node has a float16 kernel when the session's saved graph has no Cast
inserted around it (tests/test_inserted_casts.py probes every row, and a sample of operators
without one, against the installed runtime). com.microsoft operators: their records' support
(fuse_cli/ops/, targets.py's table), which the target tests check the same way.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx

from fuse_cli.core.domains import is_default_domain
from fuse_cli.ops import OPERATORS

# Default-domain operators with a CPU float16 kernel, each with the opsets (of the model's default
# domain) where it has one: (first, last), last None for every later one.
_ALWAYS = (1, None)
# Operators that move or select data, registered for every tensor type: they compute nothing.
MOVES_DATA = frozenset((
    "Cast", "CastLike", "Compress", "Concat", "Constant", "ConstantOfShape", "Expand", "Flatten", "Gather",
    "GatherElements", "GatherND", "Identity", "OptionalGetElement", "Reshape", "ReverseSequence", "Scatter",
    "ScatterElements", "ScatterND", "Shape", "Slice", "Split", "Squeeze", "Transpose", "Unsqueeze"))
STANDARD_FLOAT16_KERNELS: dict[str, tuple[int, int | None]] = {
    **dict.fromkeys(MOVES_DATA, _ALWAYS),
    # control flow runs its body, whatever the types it carries
    **dict.fromkeys(("If", "Loop", "Scan"), _ALWAYS),
    # element-wise operators with a float16 kernel
    **dict.fromkeys(("IsNaN", "Mod", "Round", "Shrink", "Sign"), _ALWAYS),
    "Clip": (12, None), "Max": (12, None), "Min": (12, None),  # float16 from their opset-12 versions
    "Dropout": (1, 11),            # the opset-12 version has none
    "IsInf": (20, None),
    "ReduceLogSumExp": (18, None),
    # onnxruntime registers its own LayerNormalization in the default domain before opset 17
    "LayerNormalization": _ALWAYS,
    "DequantizeLinear": (19, None), "QuantizeLinear": (19, None),  # float16 scales
}

# onnxruntime's own operators (com.microsoft, and those it registers in the default domain such as
# SimplifiedLayerNormalization) and the standard ones newer than them: their records' support.
_RECORDED_CPU_DTYPES = {(r.support.domain, r.op): r.support.cpu for r in OPERATORS if r.support}


# onnxruntime's own operators whose float16 node its CPU provider runs by inlining the function body
# (their records' float16_body_on_cpu: Gelu, FastGelu, QuickGelu): it inserts no Cast around the
# node itself; the body's nodes get theirs.
_FLOAT16_BODIES = frozenset(((r.support.domain if r.support else r.domain), r.op)
                            for r in OPERATORS if r.float16_body_on_cpu)


def inlined_at_float16(domain: str, op_type: str) -> bool:
    """Whether the CPU provider runs a float16 `op_type` node as its function body."""
    return ("" if domain == "ai.onnx" else domain, op_type) in _FLOAT16_BODIES


def has_cpu_float16_kernel(domain: str, op_type: str, opset: int) -> bool:
    """Whether onnxruntime's CPU provider runs a float16 `op_type` node itself (at the model's
    default-domain `opset`). An operator of another domain fuse has no record of counts as having
    one: no Cast is assumed where nothing is known."""
    domain = "" if domain == "ai.onnx" else domain
    dtypes = _RECORDED_CPU_DTYPES.get((domain, op_type))
    if dtypes is not None:
        return "float16" in dtypes
    if domain == "":
        first, last = STANDARD_FLOAT16_KERNELS.get(op_type, (0, -1))
        return first <= opset and (last is None or opset <= last)
    return True


# Operators whose float16 result is exact (it selects or compares, never rounds): where the CPU
# runs them in float16 (Clip, Max, Min; Relu from opset 18 as a float16 Max), running them in float32
# inside a fused node gives the same values.
EXACT_IN_FLOAT16 = frozenset(("Abs", "Clip", "Dropout", "Max", "Min", "Neg", "Relu", "Round", "Sign", "Where"))


def _computes(node) -> bool:
    return not (is_default_domain(node.domain) and (_op(node) in MOVES_DATA or _op(node) in EXACT_IN_FLOAT16))


def computes_in_float32_on_cpu(nodes, opset: int) -> bool:
    """Whether onnxruntime's CPU provider runs all the rounding arithmetic of float16 `nodes`
    (graphsurgeon or onnx nodes) in float32: every node that computes (not one that only moves or
    selects data, nor one whose float16 result is exact) has no float16 kernel there, so it runs
    between the Casts the provider inserts. A fused node of an operator with only a float32 CPU
    kernel then runs as they did: in float32, between Casts."""
    return any(_computes(n) for n in nodes) and computing_in_float16(nodes, opset) is None


def computing_in_float16(nodes, opset: int):
    """The first of `nodes` that computes a float16 value and that the CPU provider runs in float16
    (None: none). A predicate such as IsNaN reads float16 but writes booleans, and a Clip's float16
    result is exact: neither rounds anything a float32 run would not."""
    return next((n for n in nodes if _computes(n) and _writes_float16(n)
                 and has_cpu_float16_kernel(n.domain or "", _op(n), opset)), None)


def _writes_float16(node) -> bool:
    """Whether a graphsurgeon node writes a float16 output: by its outputs' dtypes, else by whether
    its schema lets any output be float16 (IsNaN's or Equal's cannot)."""
    dtypes = [out.dtype for out in getattr(node, "outputs", ()) if getattr(out, "dtype", None) is not None]
    if dtypes:
        return any(_is_float16(d) for d in dtypes)
    return _may_write_float16(_op(node), node.domain or "")


@functools.cache
def _may_write_float16(op: str, domain: str) -> bool:
    if not is_default_domain(domain) or not onnx.defs.has(op):
        return True
    schema = onnx.defs.get_schema(op)
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return any("tensor(float16)" in allowed.get(out.type_str, [out.type_str]) for out in schema.outputs)


def _is_float16(dtype) -> bool:
    try:
        return np.dtype(dtype) == np.float16
    except TypeError:
        return False


def _op(node) -> str:
    return getattr(node, "op_type", None) or node.op
