"""The capability table (fuse_cli/targets.py) against the installed onnxruntime, and what
`target_reason` answers for each target.

How the installed onnxruntime is asked which kernels it has, in this order:

1. registry: `get_all_opkernel_def()`, each kernel's "T" types kept only where the operator's
   schema allows them too (SkipLayerNormalization registers a float64 CPU kernel that its schema
   refuses, so no float64 model loads). Always called in a child process: in onnxruntime-gpu on a
   machine without the CUDA libraries it tries to load the CUDA and TensorRT provider libraries and
   the process dies with SIGSEGV, which must not take pytest with it.
2. probe, when that child dies: a one-node model per (operator, dtype), opened in a session on the
   provider alone with graph optimizations off. The kernel exists if the session opens and the node
   is still alone in the optimized model: the CPU provider wraps float16 nodes that only have a
   float32 kernel in Casts, and expands function operators (Gelu, FastGelu, QuickGelu) into
   elementwise ones, and neither is running the fused kernel. NOT_IMPLEMENTED, a schema type error,
   or (CUDA) the refusal to fall back to CPU mean no kernel; any other error is a broken probe.

The CUDA column is checked only where a session asked for CUDA really gets it: onnxruntime-gpu
lists CUDAExecutionProvider as available even when its libraries cannot load.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

from fuse_cli import targets
from fuse_cli.ops import OPERATORS
from fuse_cli.targets import CAPABILITIES, DTYPES, PROVIDERS_OF, TARGETS, capability, capability_rows, target_reason
from tests.conftest import saved_by_onnxruntime
from tests.graphs import IR_VERSION

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
        "float64": TensorProto.DOUBLE}
TYPE_STR = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
            "tensor(double)": "float64"}
ORT_PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}

# One-node probe models: inputs as (name, type, shape), where type T is the dtype under test and
# None skips an optional input; then the attributes a kernel needs to be constructed.
T, F, I32, I64 = "T", TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
I8, U8 = TensorProto.INT8, TensorProto.UINT8
SKIP = None
PROBES: dict[str, tuple[list, dict]] = {
    "FusedConv": ([("X", T, [1, 2, 4, 4]), ("W", T, [2, 2, 3, 3])], {"activation": "Relu"}),
    "FusedGemm": ([("A", T, [2, 3]), ("B", T, [3, 4])], {"activation": "Relu"}),
    "FusedMatMul": ([("A", T, [2, 3]), ("B", T, [3, 4])], {}),
    "DynamicQuantizeMatMul": ([("A", T, [2, 3]), ("B", I8, [3, 4]), ("b_scale", T, [4]), ("b_zero_point", I8, [4])],
                              {}),
    "MatMulIntegerToFloat": ([("A", U8, [2, 3]), ("B", I8, [3, 4]), ("a_scale", T, [1]), ("b_scale", T, [4]),
                             ("a_zero_point", U8, [1]), ("b_zero_point", I8, [4])], {}),
    "QGemm": ([("A", U8, [2, 3]), ("a_scale", T, []), ("a_zero_point", U8, []), ("B", I8, [3, 4]), ("b_scale", T, []),
               ("b_zero_point", I8, [])], {}),
    **{op: ([("A", U8, [2, 4]), ("A_scale", T, []), ("A_zero_point", U8, []), ("B", U8, [4]), ("B_scale", T, []),
             ("B_zero_point", U8, []), ("C_scale", T, []), ("C_zero_point", U8, [])], {})
       for op in ("QLinearAdd", "QLinearMul")},
    "QLinearSoftmax": ([("X", U8, [2, 4]), ("x_scale", T, []), ("x_zero_point", U8, []), ("y_scale", T, []),
                        ("y_zero_point", U8, [])], {"axis": -1, "opset": 13}),
    "QLinearGlobalAveragePool": ([("X", U8, [1, 2, 3, 3]), ("x_scale", T, []), ("x_zero_point", U8, []),
                                  ("y_scale", T, []), ("y_zero_point", U8, [])], {}),
    "SkipLayerNormalization": ([("x", T, [1, 2, 8]), ("skip", T, [1, 2, 8]), ("gamma", T, [8]), ("beta", T, [8])], {}),
    "SkipSimplifiedLayerNormalization": ([("x", T, [1, 2, 8]), ("skip", T, [1, 2, 8]), ("gamma", T, [8])], {}),
    "SimplifiedLayerNormalization": ([("x", T, [2, 8]), ("scale", T, [8])], {"axis": -1}),
    "Gelu": ([("x", T, [2, 8])], {}),
    "BiasGelu": ([("x", T, [2, 8]), ("bias", T, [8])], {}),
    "FastGelu": ([("x", T, [2, 8]), ("bias", T, [8])], {}),
    "QuickGelu": ([("x", T, [2, 8])], {"alpha": 1.702}),
    "Attention": ([("x", T, [1, 2, 16]), ("w", T, [16, 48]), ("b", T, [48])], {"num_heads": 2}),
    "EmbedLayerNormalization": ([("ids", I32, [1, 2]), ("segments", I32, [1, 2]), ("word", T, [4, 8]),
                                 ("position", T, [4, 8]), ("segment", T, [2, 8]), ("gamma", T, [8]), ("beta", T, [8])],
                                {"epsilon": 1e-12, "mask_index_type": 0}),
    "MultiHeadAttention": ([("q", T, [1, 2, 16]), ("k", T, [1, 2, 16]), ("v", T, [1, 2, 16])], {"num_heads": 2}),
    "GroupQueryAttention": ([("q", T, [1, 2, 16]), ("k", T, [1, 2, 8]), ("v", T, [1, 2, 8]), SKIP, SKIP,
                             ("seqlens_k", I32, [1]), ("total_sequence_length", I32, [])],
                            {"num_heads": 2, "kv_num_heads": 1}),
    "RotaryEmbedding": ([("x", T, [1, 2, 16]), ("position_ids", I64, [1, 2]), ("cos", T, [4, 4]), ("sin", T, [4, 4])],
                        {"num_heads": 2}),
    "BiasAdd": ([("x", T, [1, 4, 8]), ("bias", T, [8]), ("skip", T, [1, 4, 8])], {}),
    "BiasSplitGelu": ([("x", T, [1, 4, 16]), ("bias", T, [16])], {}),
    "BiasSoftmax": ([("x", T, [2, 8]), ("bias", T, [2, 8])], {"axis": -1, "is_inner_broadcast": 0}),
    "NhwcConv": ([("X", T, [1, 4, 4, 2]), ("W", T, [2, 3, 3, 2])], {}),
    "GroupNorm": ([("x", T, [1, 4, 4, 8]), ("gamma", F, [8]), ("beta", F, [8])],
                  {"activation": 0, "groups": 2, "epsilon": 1e-5}),
    "SkipGroupNorm": ([("x", T, [1, 4, 4, 8]), ("gamma", F, [8]), ("beta", F, [8]), ("skip", T, [1, 4, 4, 8])],
                      {"activation": 0, "groups": 2, "epsilon": 1e-5}),
    "GemmFastGelu": ([("x", T, [2, 4]), ("w", T, [4, 8])], {}),
}

# The type parameter that names the float dtype the table lists, where it is not "T" (the
# quantized matmuls' integer operands have type parameters of their own)
# Operators whose output is a quantized type, whatever the float type of their scales: as their
# records' probes declare it
QUANTIZED_OUTPUT = {r.op: helper.np_dtype_to_tensor_dtype(np.dtype(r.probe.output_dtype))
                    for r in OPERATORS if r.probe and r.probe.output_dtype}
# ("": the scales' float32 is fixed by the schema, no type parameter names it)
FLOAT_PARAM = {"DynamicQuantizeMatMul": "T1", "MatMulIntegerToFloat": "T3", "QLinearAdd": "", "QLinearMul": "",
               "QLinearSoftmax": "", "QLinearGlobalAveragePool": ""}

REGISTRY_CHILD = """
import json, sys
from onnxruntime.capi import onnxruntime_pybind11_state as C
param = {(op, domain): name for op, domain, name in json.loads(sys.argv[1])}
wanted = set(param)
allowed = {}
for s in C.get_all_operator_schema():
    key = (s.name, s.domain)
    if key in wanted and s.since_version >= allowed.get(key, (0, None))[0]:
        types = {c.type_param_str: set(c.allowed_type_strs) for c in s.type_constraints}
        allowed[key] = (s.since_version, types.get(param[key], set()) if param[key] else {"tensor(float)"})
kernels = {}
for k in C.get_all_opkernel_def():
    key = (k.op_name, k.domain)
    if key in wanted:
        kinds = set(dict(k.type_constraints).get(param[key], [])) if param[key] else {"tensor(float)"}
        found = kinds & allowed.get(key, (0, set()))[1]
        kernels.setdefault("|".join((*key, k.provider)), set()).update(found)
print(json.dumps({key: sorted(types) for key, types in kernels.items()}))
"""

CUDA_CHILD = """
import onnx
import onnxruntime as ort
from onnx import helper
ort.set_default_logger_severity(4)
x, y = (helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [2]) for name in "xy")
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
print(session.get_providers())
"""


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code, *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", "no answer within 120 s")


def _death(result: subprocess.CompletedProcess) -> str:
    if result.returncode < 0:
        return f"killed by {signal.Signals(-result.returncode).name}"
    tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return f"exit status {result.returncode}: {tail[:200]}"


@functools.cache
def registry_kernels() -> tuple[dict[tuple[str, str, str], frozenset[str]] | None, str]:
    """{(op, domain, provider): dtypes} from the kernel registry, or None and why it is unusable."""
    wanted = json.dumps(sorted({(c.op, c.domain, FLOAT_PARAM.get(c.op, "T")) for c in CAPABILITIES}))
    result = _child(REGISTRY_CHILD, wanted)
    if result.returncode != 0:
        return None, f"get_all_opkernel_def() in a child process: {_death(result)}"
    kernels = {}
    for key, types in json.loads(result.stdout).items():
        op, domain, provider = key.split("|")
        kernels[op, domain, provider] = frozenset(TYPE_STR[t] for t in types if t in TYPE_STR)
    return kernels, "onnxruntime's kernel registry (get_all_opkernel_def in a child process), within the schemas"


@functools.cache
def cuda_unavailable() -> str | None:
    """None when a session asked for CUDA really runs on it, else why not."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"this onnxruntime ({ort.__version__}) is built without CUDAExecutionProvider"
    result = _child(CUDA_CHILD)
    if result.returncode != 0:
        return f"a session asking for CUDAExecutionProvider failed ({_death(result)})"
    if "CUDAExecutionProvider" not in result.stdout:
        return f"a session asking for CUDAExecutionProvider got {result.stdout.strip()}: its libraries do not load here"
    return None


def probe_model(op: str, domain: str, dtype: str) -> onnx.ModelProto:
    inputs, attrs = PROBES[op]
    value_infos = [helper.make_tensor_value_info(name, ELEM[dtype] if kind == T else kind, shape)
                   for name, kind, shape in filter(None, inputs)]
    node = helper.make_node(op, [i[0] if i else "" for i in inputs], ["y"], domain=domain, **attrs)
    output = QUANTIZED_OUTPUT.get(op, ELEM[dtype])
    graph = helper.make_graph([node], "probe", value_infos, [helper.make_tensor_value_info("y", output, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def probe(op: str, domain: str, dtype: str, provider: str, workdir: Path) -> bool:
    """Does a one-node model run `op` at `dtype` with the provider's own kernel?"""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    options.optimized_model_filepath = str(workdir / f"{op}.{dtype}.{provider}.onnx")
    if provider == "cuda":
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        ort.InferenceSession(probe_model(op, domain, dtype).SerializeToString(), options,
                             providers=[ORT_PROVIDER[provider]])
    except OrtNotImplemented:
        return False
    except InvalidGraph as error:
        if "Type Error: Type 'tensor(" in str(error):  # the schema itself refuses the dtype
            return False
        raise
    except Exception as error:  # onnxruntime raises a Fail for the CUDA refusal; anything else is a broken probe
        # the CUDA refusal reads one of two ways (onnxruntime-gpu 1.31 on an H200 gave the second)
        if provider == "cuda" and ("fallback to CPU EP has been explicitly disabled" in str(error)
                                   or "Provider type for" in str(error) and "is not set" in str(error)):
            return False
        raise
    nodes = [n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node]
    return [n for n in nodes if n not in ("MemcpyFromHost", "MemcpyToHost")] == [op]


def observed_kernels(provider: str, workdir: Path) -> tuple[dict[str, frozenset[str]], str]:
    """{op: dtypes with a kernel on `provider`} as the installed onnxruntime says, and how it was asked."""
    kernels, how = registry_kernels()
    if kernels is not None and any(key[2] == ORT_PROVIDER[provider] for key in kernels):
        return {c.op: kernels.get((c.op, c.domain, ORT_PROVIDER[provider]), frozenset()) for c in CAPABILITIES}, how
    why = how if kernels is None else f"it lists no {ORT_PROVIDER[provider]} kernels"
    how = f"one-node session probes on {ORT_PROVIDER[provider]}, not the kernel registry ({why})"
    observed = {c.op: frozenset(d for d in DTYPES if probe(c.op, c.domain, d, provider, workdir)) for c in CAPABILITIES}
    return observed, how


def disagreements(provider: str, observed: dict[str, frozenset[str]]) -> list[str]:
    wrong = []
    for cap in CAPABILITIES:
        listed, present = cap.dtypes(provider), observed[cap.op] & set(DTYPES)
        if listed - present:
            wrong.append(f"{cap.op}: the table lists {sorted(listed - present)}, onnxruntime has no kernel")
        if present - listed:
            wrong.append(f"{cap.op}: onnxruntime has {sorted(present - listed)} kernels the table omits")
    return wrong


# ---- the table against the runtime -------------------------------------------------------------

def test_every_row_has_a_probe_model():
    assert set(PROBES) == {c.op for c in CAPABILITIES}
    assert len({(c.op, c.domain) for c in CAPABILITIES}) == len(CAPABILITIES)


def test_cpu_column_matches_installed_onnxruntime(tmp_path, record_property):
    observed, how = observed_kernels("cpu", tmp_path)
    record_property("kernel_source", how)
    print(f"CPU kernels asked through {how}")
    wrong = disagreements("cpu", observed)
    assert not wrong, f"CPU column vs onnxruntime {ort.__version__}, asked through {how}:\n" + "\n".join(wrong)


def test_cuda_column_matches_installed_onnxruntime(tmp_path, record_property):
    why_not = cuda_unavailable()
    if why_not:
        pytest.skip(f"CUDA column (from onnxruntime's docs/OperatorKernels.md) not checked: {why_not}")
    observed, how = observed_kernels("cuda", tmp_path)
    record_property("kernel_source", how)
    print(f"CUDA kernels asked through {how}")
    wrong = disagreements("cuda", observed)
    assert not wrong, f"CUDA column vs onnxruntime {ort.__version__}, asked through {how}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("op, dtype, runs", [
    ("FusedConv", "float32", True),
    ("FusedConv", "float16", False),  # the session opens, with Casts around a float32 kernel
    ("FastGelu", "float64", False),  # the session opens, with FastGelu expanded into elementwise ops
    ("SkipLayerNormalization", "float64", False),  # a kernel is registered, but the schema refuses the model
    ("BiasAdd", "float32", False),  # NOT_IMPLEMENTED
])
def test_probe_tells_a_kernel_from_a_session_that_merely_opens(tmp_path, op, dtype, runs):
    assert probe(op, capability(op).domain, dtype, "cpu", tmp_path) is runs


# ---- target_reason -----------------------------------------------------------------------------

@pytest.mark.parametrize("target, op, dtype, expected", [
    ("ort-cpu", "FusedGemm", "float32", None),
    ("ort", "FusedGemm", "float32",
     "FusedGemm has no kernel on onnxruntime's CUDA provider (target ort); --target ort-cpu allows it"),
    ("ort-cuda", "FusedGemm", np.float32,
     "FusedGemm has no kernel on onnxruntime's CUDA provider (target ort-cuda); --target ort-cpu allows it"),
    ("ort-cpu", "FusedConv", np.float16,
     "FusedConv has no float16 kernel on onnxruntime's CPU provider (target ort-cpu)"),
    ("ort", "FusedConv", "float32", None),
    ("onnx", "FusedConv", "float32",
     "com.microsoft::FusedConv is not a standard ONNX operator (target onnx); use --target ort"),
    ("ort", "GroupQueryAttention", "float16", None),
    ("ort-cuda", "GroupQueryAttention", "float32",
     "GroupQueryAttention has no float32 kernel on onnxruntime's CUDA provider (target ort-cuda); "
     "--target ort-cpu allows it"),
    ("ort-cpu", "GroupQueryAttention", "bfloat16",
     "GroupQueryAttention has no bfloat16 kernel on onnxruntime's CPU provider (target ort-cpu); "
     "--target ort-cuda allows it"),
    ("ort", "BiasAdd", "float16",
     "BiasAdd has no kernel on onnxruntime's CPU provider (target ort); --target ort-cuda allows it"),
    ("ort-cuda", "BiasAdd", "float16", None),
    ("ort", "GemmFastGelu", "float32",
     "GemmFastGelu has no kernel on onnxruntime's CPU or CUDA providers (target ort)"),
])
def test_target_reason(target, op, dtype, expected):
    assert target_reason(target, op, dtype) == expected


@pytest.mark.parametrize("target", TARGETS)
def test_target_reason_is_none_exactly_where_every_provider_has_the_dtype(target):
    for cap in CAPABILITIES:
        for dtype in DTYPES:
            allowed = bool(PROVIDERS_OF[target]) and all(dtype in cap.dtypes(p) for p in PROVIDERS_OF[target])
            reason = target_reason(target, cap.op, dtype, cap.domain)
            assert (reason is None) == allowed, (target, cap.op, dtype, reason)
            if reason and target != "onnx":
                missing = [targets.PROVIDER_NAMES[p] for p in PROVIDERS_OF[target] if dtype not in cap.dtypes(p)]
                assert all(name in reason for name in missing) and f"(target {target})" in reason


def test_default_domain_operator_onnxruntime_registers_is_not_standard_onnx():
    reason = target_reason("onnx", "SimplifiedLayerNormalization", "float32", domain="")
    assert reason == "SimplifiedLayerNormalization is not a standard ONNX operator (target onnx); use --target ort"
    assert target_reason("ort", "SimplifiedLayerNormalization", "bfloat16", domain="ai.onnx") is None


@pytest.mark.parametrize("target", TARGETS)
def test_standard_operators_are_allowed_everywhere(target):
    assert target_reason(target, "Conv", "float16", domain="") is None
    assert target_reason(target, "LayerNormalization", np.float32, domain="ai.onnx") is None


@pytest.mark.parametrize("target", TARGETS)
def test_unknown_operator_gets_a_reason(target):
    reason = target_reason(target, "FusedEverything", "float32")
    assert reason and "com.microsoft::FusedEverything" in reason and f"(target {target})" in reason
    reason = target_reason(target, "NotAnOp", "float32", domain="")
    assert reason == f"NotAnOp is not an ONNX operator (target {target})"


def test_dtype_spellings_agree():
    spellings = ["float16", "fp16", "half", np.float16, np.dtype("float16"), TensorProto.FLOAT16]
    assert {targets.dtype_name(s) for s in spellings} == {"float16"}
    assert targets.dtype_name(TensorProto.BFLOAT16) == "bfloat16" and targets.dtype_name("double") == "float64"
    assert target_reason("ort-cpu", "FusedConv", TensorProto.FLOAT16) == target_reason("ort-cpu", "FusedConv", "half")


def test_unknown_dtype_refuses_onnxruntime_operators_only():
    assert target_reason("ort", "FusedConv", None) == (
        "the dtype is unknown, so fuse cannot tell whether onnxruntime's CPU and CUDA providers run FusedConv "
        "(target ort)")
    assert target_reason("onnx", "FusedConv", None).startswith("com.microsoft::FusedConv is not a standard ONNX")
    assert target_reason("ort-cpu", "Conv", None, domain="") is None


def test_unknown_target_is_an_error():
    with pytest.raises(ValueError, match="ort-gpu"):
        target_reason("ort-gpu", "FusedConv", "float32")
    with pytest.raises(ValueError, match="ort-gpu"):
        capability_rows("ort-gpu")


def test_capability_lookup():
    assert capability("FusedConv").cpu == {"float32"}
    assert capability("SimplifiedLayerNormalization", "") is capability("SimplifiedLayerNormalization", "ai.onnx")
    assert capability("SimplifiedLayerNormalization") is None  # not in com.microsoft
    assert capability("NoSuchOp") is None


# ---- the rows `fuse passes --target T` prints --------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_capability_rows(target):
    rows = capability_rows(target)
    assert [r[0] for r in rows] == [c.op for c in CAPABILITIES]
    assert all(len(r) == len(targets.CAPABILITY_HEADERS) for r in rows)
    by_op = {r[0]: r for r in rows}
    assert by_op["FusedConv"][2:4] == ("float32", "float32")
    assert by_op["FusedGemm"][3] == "none"
    usable = {"onnx": "no (not standard ONNX)", "ort": "no", "ort-cpu": "float32", "ort-cuda": "no"}[target]
    assert by_op["FusedGemm"][4] == usable
    assert by_op["SimplifiedLayerNormalization"][1] == "(default)"


def test_targets_match_the_pass_registry():
    from fuse_cli.pipeline.registry import TARGETS as registry_targets

    assert tuple(registry_targets) == TARGETS


# ---- the policy passes consult: emitted operators -> targets, measured slowdowns -------------------
@pytest.mark.parametrize("emits, expected", [
    ((), {"onnx", "ort", "ort-cpu", "ort-cuda"}),
    (("LayerNormalization",), {"onnx", "ort", "ort-cpu", "ort-cuda"}),
    (("SimplifiedLayerNormalization",), {"ort", "ort-cpu", "ort-cuda"}),
    (("com.microsoft::FusedGemm",), {"ort-cpu"}),  # no CUDA kernel
    (("com.microsoft::SkipLayerNormalization",), {"ort-cuda"}),  # measured slower on the CPU
    (("com.microsoft::FusedConv",), {"ort", "ort-cpu", "ort-cuda"}),  # slower on CUDA: declined per match
])
def test_usable_targets(emits, expected):
    assert targets.usable_targets(emits) == expected


def test_registered_passes_take_their_targets_from_what_they_emit():
    from fuse_cli.passes import REGISTRY

    for p in REGISTRY.values():
        expected = targets.usable_targets(p.emits)
        if p.for_provider:
            expected &= targets.targets_of_provider_alone(p.for_provider)
        assert p.targets == expected, p.name
    assert REGISTRY["write-cpu-casts"].targets == {"ort-cpu"}


@pytest.mark.parametrize("target, op, words", [
    ("ort-cuda", "FusedConv", "CUDA FusedConv measured 1.8-2.5x slower"),
    ("ort", "FusedConv", "(target ort); --target ort-cpu fuses it"),
    ("ort-cpu", "BiasGelu", "CPU BiasGelu measured 1.04-1.28x slower than the Add + Gelu"),
    ("ort-cpu", "EmbedLayerNormalization", "CPU EmbedLayerNormalization measured 1.39-1.55x slower than BERT's"),
    ("ort-cuda", "Attention", "measured faster than the Q/K/V MatMuls and MultiHeadAttention on onnxruntime's CPU"),
])
def test_emit_reason_gives_the_measured_slowdown(target, op, words):
    assert words in targets.emit_reason(target, op, "float32")


def test_emit_reason_is_the_capability_reason_first():
    assert targets.emit_reason("ort-cuda", "FusedConv", "float16") == target_reason("ort-cuda", "FusedConv", "float16")
    assert targets.emit_reason("ort-cpu", "FusedConv", "float32") is None
    assert targets.slower("ort-cpu", "FusedConv") is None and targets.slower("ort", "FusedConv").provider == "cuda"


def test_a_form_checked_on_cpu_only_is_declined_where_cuda_may_run_it():
    """GroupQueryAttention (causal=0 with an attention_bias) was checked against the unfused math on
    the CPU provider only: targets that may run on CUDA decline it even where CUDA has a kernel."""
    import numpy as np

    from fuse_cli.targets import emit_reason

    assert emit_reason("ort-cpu", "GroupQueryAttention", np.dtype(np.float16)) is None
    for target in ("ort", "ort-cuda"):
        assert "verified on onnxruntime's CPU provider only" in emit_reason(target, "GroupQueryAttention",
                                                                          np.dtype(np.float16))


# ---- float16 on the CPU provider: a float32-only kernel between the Casts onnxruntime inserts ----

def _runs_float16_on_cpu_as(op: str, domain: str, workdir: Path) -> str:
    """What onnxruntime's CPU provider makes of a one-node float16 `op` (optimizations off): "kernel"
    (its float16 kernel), "casts" (its float32 kernel between inserted Casts), "body" (its
    function body inlined) or "refused" (its schema takes no float16 there: the quantized ones)."""
    try:
        saved = saved_by_onnxruntime(probe_model(op, domain, "float16"), workdir)
    except InvalidGraph as error:
        if "Type Error: Type 'tensor(float16)'" in str(error):
            return "refused"
        raise
    kinds = [n.op_type for n in saved.graph.node]
    return "kernel" if kinds == [op] else "casts" if op in kinds else "body"


@pytest.mark.parametrize("cap", [c for c in CAPABILITIES if "float32" in c.cpu and "float16" not in c.cpu],
                         ids=lambda c: c.op)
def test_float16_body_on_cpu_is_what_the_runtime_does(cap, tmp_path):
    """The records' float16_body_on_cpu, probed: at float16 the CPU provider either casts around the
    float32 kernel (a fused node that may replace float32-run nodes) or inlines the function body
    (the nodes a fusion replaces: nothing fused runs)."""
    ran = _runs_float16_on_cpu_as(cap.op, cap.domain, tmp_path)
    flagged = (cap.domain, cap.op) in targets.FLOAT16_BODY_ON_CPU
    if ran == "refused":  # its schema takes no float16 (the quantized operators): no such node exists
        assert not flagged
    else:
        assert ran == ("body" if flagged else "casts")


def test_a_float32_only_cpu_kernel_takes_float16_where_the_replaced_nodes_ran_in_float32():
    assert "no float16 kernel" in targets.emit_reason("ort-cpu", "MultiHeadAttention", "float16")
    assert targets.emit_reason("ort-cpu", "MultiHeadAttention", "float16", replaced_in_float32=True) is None
    # CUDA has a float16 kernel: `ort` needs only the CPU's casts
    assert targets.emit_reason("ort", "MultiHeadAttention", "float16", replaced_in_float32=True) is None
    # its function body, not the float32 kernel, would run at float16: only where the CPU is the one
    # provider, inside Casts fuse writes (a float32 island); on `ort` CUDA would compute in float32 too
    assert targets.emit_reason("ort-cpu", "FastGelu", "float16", replaced_in_float32=True) is None
    assert targets.runs_in_float32_island("ort-cpu", "FastGelu", "float16", "com.microsoft")
    assert not targets.runs_in_float32_island("ort-cpu", "MultiHeadAttention", "float16", "com.microsoft")
    assert not targets.runs_in_float32_island("ort-cpu", "FastGelu", "float32", "com.microsoft")
    assert "no float16 kernel" in targets.emit_reason("ort", "FastGelu", "float16", replaced_in_float32=True)
    assert "no float16 kernel" in targets.emit_reason("ort-cpu", "FastGelu", "float16")
    # the CPU casts only float16: not bfloat16, and not an operator CUDA has no float16 kernel for
    assert targets.emit_reason("ort-cpu", "MultiHeadAttention", "bfloat16", replaced_in_float32=True)
    assert targets.emit_reason("ort", "FusedConv", "float16", replaced_in_float32=True)


def test_what_counts_as_computing_in_float16_on_the_cpu():
    import onnx_graphsurgeon as gs

    from fuse_cli.ops.cpu_float16 import computes_in_float32_on_cpu, computing_in_float16

    def node(op, out_dtype):
        return gs.Node(op, op.lower(), outputs=[gs.Variable(f"{op}_out", dtype=out_dtype)])

    matmul, softmax = node("MatMul", np.float16), node("Softmax", np.float16)
    is_nan, clip, reshape = node("IsNaN", np.bool_), node("Clip", np.float16), node("Reshape", np.float16)
    norm = node("LayerNormalization", np.float16)  # a float16 CPU kernel that rounds
    assert computes_in_float32_on_cpu([matmul, reshape, softmax], 17)
    # IsNaN runs in float16 but writes booleans; Clip runs in float16 but its result is exact
    assert computes_in_float32_on_cpu([matmul, is_nan, softmax], 17)
    assert computes_in_float32_on_cpu([matmul, clip], 17) and computing_in_float16([matmul, clip], 17) is None
    assert computing_in_float16([matmul, norm], 17) is norm and not computes_in_float32_on_cpu([matmul, norm], 17)
    assert not computes_in_float32_on_cpu([reshape, clip], 17)  # moves or selects only: nothing to run in float32
    # undeclared outputs: by the schema, IsNaN writes booleans only, LayerNormalization may write float16
    assert computes_in_float32_on_cpu([matmul, node("IsNaN", None)], 17)
    assert not computes_in_float32_on_cpu([matmul, node("LayerNormalization", None)], 17)
