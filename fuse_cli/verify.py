"""Run an original and an optimized model on the same inputs in onnxruntime and compare outputs.

Results carry statistics per output (max abs/rel difference, cosine similarity), not a bool.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import onnx

from fuse_cli.core import isolation, model_runs, sessions
from fuse_cli.core.order import execution_order
from fuse_cli.core.isolation import RuntimeCrash
from fuse_cli.core.sessions import run
from fuse_cli.errors import FuseError
from fuse_cli.core.feeds import random_inputs, value_key
from fuse_cli.graph.io import read_original
from fuse_cli.progress import model_run, update
from fuse_cli.report.verification import (
    INCONCLUSIVE, MATCH, MISMATCH, UNVERIFIABLE, OutputComparison, VerifyResult)
from fuse_cli.input_domain import (binding, branch_inputs, derived_settings, describe_setting, free_symbols,
                                   integer_ranges, shape_settings)

# run, random_inputs and the verdict's records are re-exported for callers; __all__ says so to linters
__all__ = ["DEFAULT_TOLERANCES", "INCONCLUSIVE", "MATCH", "MISMATCH", "UNVERIFIABLE", "OutputComparison", "Reference",
           "ReferencePlan", "VerifyResult", "compare_outputs", "compare_with_reference", "computed_dtypes",
           "load_inputs", "make_session", "parse_int_ranges", "random_inputs", "reference_for", "reference_outputs",
           "reference_plan", "run", "verify_models"]

# (rtol, atol) by output dtype: fp32 per the project standard; fp16/bf16 keep ~3 significant digits.
# The default atol is scaled by the output's magnitude (see compare_outputs). float16's is 4 of its
# ulps there (eps 9.8e-4): a correct fusion in a 12-layer float16 BERT moves elements near 0 by
# 2.5 ulps of the output's magnitude (0.0098 at 5), which an atol of one ulp (1e-3) called a
# mismatch, rolling back gelu, static-reshape-shape and matmul-add-into-view (fp16_parity.md).
DEFAULT_TOLERANCES = {
    np.dtype(np.float64): (1e-6, 1e-8),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float16): (1e-2, 4e-3),
}

# An output a DequantizeLinear writes takes values on a grid of its scale, and a quantized kernel
# (QLinearConv, QLinearMatMul: exact int32 sums requantized once) may round an intermediate one step
# away from the float DQ -> op -> Q it replaces; the step carries through later layers. Such an
# output passes within this many steps of its scale (the largest, where it is per axis) elementwise,
# where that exceeds the float tolerance. onnxruntime's own kernels, formed at ORT_ENABLE_EXTENDED,
# move the outputs of benchmarks/corpus/quantized.py's QDQ models by 1-35 steps of a 256-step grid
# (35: a random-init BERT layer, whose attention softmax amplifies a step; ResNet50 8, BERT-base 14);
# fuse's QLinearConv / QLinearMatMul by the same (benchmarks/results/quantized.md).
QUANTIZED_OUTPUT_STEPS = 48

# An output downstream of a quantizer (QuantizeLinear, DynamicQuantizeLinear) is a step function of
# the float values before it: a kernel's last-bit difference upstream (onnxruntime's Gelu against
# its Erf form, ~1e-7) flips a rounding and moves the output by a whole step times what follows
# (BERT-base quantized dynamically: 0.05 on outputs of magnitude 6). Where the original has such
# outputs, its reference run also runs it at onnxruntime's own default level (all) on the same
# inputs, and an output passes within what that moves it by (its runtime envelope), where that
# exceeds the other tolerances: a rewrite is not held to more than the runtime's own optimizer is.
# The envelope of BERT-base so quantized is 0.11-0.13, its fused Gelu's 0.05; a wrong rewrite moves an
# output by far more (a weight scale 10% off in the quantized sample block: 0.21 against its
# envelope of 0.0027, tests/test_verify_envelope.py).
#
# A max over elements is one sample, though: the kernels a rewrite forms flip other roundings than
# the runtime's own, and a flip lands where an element happens to sit next to a rounding boundary.
# A correct MultiHeadAttention before a DynamicQuantizeLinear (1e-7 off in float) moved 2 of 256
# rows of a quantized block's output by 0.014 at one setting, where onnxruntime's own optimizer
# moved it by 0.0024, and by 1e-6 at three other settings; a QLinearMatMul moved a random-init BERT
# layer's output by 0.105 against the runtime's 0.103 (1 element of 960 beyond). So an output after
# a quantizer beyond its bounds in at most FLIP_FRACTION of its elements, each by little (FLIP_GRID),
# at a setting is judged again on fresh inputs at that setting (the next seed). A flip lands on
# other elements there, or on none; a rewrite wrong at some positions is wrong at the same ones, and a wrong
# scale moves nearly every element (2% off: 99.9% of that block's, at any seed).
FLIP_FRACTION = 0.01
# ... each beyond its bounds by at most FLIP_STEPS steps of a FLIP_GRID-level grid over the original
# output's range. Measured: the block's flips 0.010-0.014 beyond, its range 9.8-11.4 (a step
# 0.039-0.045); the BERT layer's element 1.0 step (its output's own scale, 0.0018, is that step);
# a clip at the output's 99.7th percentile moved the elements it cut by 2.0, 50 steps.
FLIP_GRID = 255
FLIP_STEPS = 2

# verification's session, in this process (tests and tools that run a model themselves)
make_session = model_runs.session_for_verification


def compare_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    rtol: float | None = None, atol: float | None = None,
                    computed_in: Mapping[str, np.dtype] | None = None,
                    steps: Mapping[str, float] | None = None,
                    envelope: Mapping[str, float] | None = None) -> VerifyResult:
    """Per output: |got - want| <= atol + rtol * |want| elementwise over the finite elements, and
    NaN/inf exactly where the original has the same NaN/inf.

    The default tolerances are those of the dtype an output is computed in (`computed_in`, see
    computed_dtypes), else of its own: an fp16 model with float32 inputs and outputs carries
    fp16 rounding in its float32 outputs.

    A given `atol` is absolute. The default one scales with the output's typical magnitude (when
    that exceeds 1): a float32 sum of many terms carries rounding error in proportion to the
    terms, so an element near zero in logits of magnitude 10 legitimately differs by more than
    1e-5 after a correct fold (resnet50: 3.5e-5, the same as PyTorch vs onnxruntime on the
    unfused model), while a real error (eps dropped, a wrong axis) is orders of magnitude larger.
    Typical, not largest: one -1e6 mask fill must not loosen the tolerance of every other element.
    An output a DequantizeLinear writes (`steps`: its scale, see quantized_output_steps) is allowed
    QUANTIZED_OUTPUT_STEPS steps of it instead, where that is more; an output downstream of a
    quantizer its runtime envelope (`envelope`, see the comment above compare_outputs), where that
    is more.
    """
    results = []
    for name, want in expected.items():
        if name not in actual:
            raise FuseError(f"the optimized model has no output named {name!r}")
        want = np.asarray(want)
        dtype = np.dtype((computed_in or {}).get(name, want.dtype))
        default_rtol, default_atol = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES.get(want.dtype, (0.0, 0.0)))
        r = rtol if rtol is not None else default_rtol
        bound = (envelope or {}).get(name)
        a = atol if atol is not None else max(default_atol * _magnitude(want),
                                              QUANTIZED_OUTPUT_STEPS * (steps or {}).get(name, 0.0), bound or 0.0)
        results.append(replace(_compare_one(name, want, np.asarray(actual[name]), r, a), runtime_envelope=bound))
    return _verdict(results)


def _verdict(outputs: list[OutputComparison], settings=()) -> VerifyResult:
    if not all(o.passed for o in outputs):
        return VerifyResult(tuple(outputs), MISMATCH, settings=settings)
    empty = [o.name for o in outputs if o.all_nonfinite]
    if empty:
        reason = f"output {empty[0]!r} is entirely NaN/inf, so nothing in it was compared"
        return VerifyResult(tuple(outputs), INCONCLUSIVE, reason, settings)
    return VerifyResult(tuple(outputs), MATCH, settings=settings)


# The quantile of |value| that stands for an output's magnitude: "lower" picks a real element, so
# with 100 elements or more the largest one never sets the scale.
_MAGNITUDE_QUANTILE = 0.99


def _magnitude(values: np.ndarray) -> float:
    if values.dtype.kind not in "fc" or values.size == 0:
        return 1.0
    finite = np.abs(values[np.isfinite(values)])
    if not finite.size:
        return 1.0
    return max(1.0, float(np.quantile(finite, _MAGNITUDE_QUANTILE, method="lower")))


def _compare_one(name: str, want: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> OutputComparison:
    if want.shape != got.shape or want.dtype != got.dtype:
        problem = f"it is {got.dtype}{list(got.shape)} where the original gives {want.dtype}{list(want.shape)}"
        return OutputComparison(name, str(want.dtype), tuple(want.shape), float("inf"), float("inf"), 0.0, rtol, atol,
                                False, problem=problem)
    if want.dtype.kind not in "fc":
        equal = want == got
        max_abs = float(np.abs(want.astype(np.float64) - got.astype(np.float64)).max()) if want.size else 0.0
        return OutputComparison(name, str(want.dtype), tuple(want.shape), max_abs, max_abs,
                                1.0 if equal.all() else 0.0, rtol, atol, bool(equal.all()))
    w, g = want.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    finite_w, finite_g = np.isfinite(w), np.isfinite(g)
    both = finite_w & finite_g
    # NaN where the original has NaN, and the same infinity, are agreement, not a difference
    same_special = (np.isnan(w) & np.isnan(g)) | (np.isinf(w) & (w == g))
    special_mismatches = int(np.count_nonzero(~both & ~same_special))
    w, g = w[both], g[both]
    diff = np.abs(w - g)
    max_abs = float(diff.max()) if diff.size else 0.0
    # relative to elements the absolute tolerance does not cover: next to a reference of 0 (a
    # sigmoid's saturated zeros) any difference is "infinitely" relative and says nothing
    away_from_zero = np.abs(w) > atol
    max_rel = float((diff[away_from_zero] / np.abs(w[away_from_zero])).max()) if away_from_zero.any() else 0.0
    norms = np.linalg.norm(w) * np.linalg.norm(g)
    cosine = float(np.dot(w, g) / norms) if norms > 0 else 1.0
    beyond = int(np.count_nonzero(diff > atol + rtol * np.abs(w))) + special_mismatches
    all_nonfinite = want.size > 0 and (not finite_w.any() or not finite_g.any())
    return OutputComparison(name, str(want.dtype), tuple(want.shape), max_abs, max_rel, cosine, rtol, atol,
                            beyond == 0, special_mismatches, all_nonfinite, beyond=beyond)


@dataclass(frozen=True)
class Reference:
    """The original's outputs on seeded inputs, per shape setting, computed once: a bisection
    compares many candidates against them, and the original's session is gone before any
    candidate's is built (two sessions of a model of several GB would hold its weights twice).
    `error` says why the original could not run (then `runs` is empty)."""

    runs: tuple[tuple[dict[str, int], dict[str, np.ndarray], dict[str, np.ndarray]], ...]  # (dims, feeds, outputs)
    error: str | None = None
    computed_in: Mapping[str, np.dtype] = field(default_factory=dict)  # computed_dtypes of the original
    steps: Mapping[str, float] = field(default_factory=dict)  # quantized_output_steps of the original
    note: str | None = None  # where the settings came from, when derived from the model
    # per output downstream of a quantizer, the largest runtime envelope over the settings
    envelope: Mapping[str, float] = field(default_factory=dict)
    # the original at a setting on fresh inputs (the next seed), for a rounding flip's second look;
    # None where the inputs were given
    fresh: Callable[[Mapping[str, int]], Reference] | None = field(default=None, compare=False, repr=False)
    _fresh_runs: dict = field(default_factory=dict, compare=False, repr=False)

    def fresh_at(self, dims: Mapping[str, int]) -> Reference | None:
        """The original at `dims` on the next seed's inputs, run once per reference."""
        if self.fresh is None:
            return None
        key = tuple(sorted(dims.items()))
        if key not in self._fresh_runs:
            self._fresh_runs[key] = self.fresh(dims)
        return self._fresh_runs[key]

    @property
    def settings(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        return tuple(tuple(dims.items()) for dims, _, _ in self.runs)


def reference_outputs(original: onnx.ModelProto | str, settings: Sequence[Mapping[str, int]], *, seed: int = 0,
                      int_ranges: Mapping[str, tuple[int, int] | None] | None = None,
                      feeds: Mapping[str, np.ndarray] | None = None) -> Reference:
    """Run the original at each setting (given `feeds` take their own shapes: one run), in the
    worker process (core/isolation.py): a crash there makes the model unverifiable, not fuse dead."""
    source = sessions.source_of(original)
    header = original if isinstance(original, onnx.ModelProto) else read_original(original)  # weights by reference
    runs = []
    chosen = [{}] if feeds else settings
    quantized = outputs_after_quantizers(header.graph)
    envelope: dict[str, float] = {}
    for index, dims in enumerate(chosen):
        try:
            with model_run("original", [dims], f"setting {index + 1} of {len(chosen)} ({describe_setting(dims)})"):
                inputs, outputs = isolation.call(model_runs.reference_run, source, dict(dims), seed=seed,
                                                 int_ranges=int_ranges, feeds=feeds)
            runs.append((dict(dims), inputs, outputs))
        except FuseError as exc:
            where = "on the given inputs" if feeds else f"at {describe_setting(dims)}"
            return Reference((), f"the original model cannot run {where}: {exc}")
        if quantized:
            envelope = _widest(envelope, _runtime_envelope(source, dims, inputs, outputs, quantized))
    fresh = None if feeds or not quantized else (
        lambda dims: reference_outputs(original, [dims], seed=seed + 1, int_ranges=int_ranges))
    return Reference(tuple(runs), computed_in=computed_dtypes(header.graph), steps=quantized_output_steps(header.graph),
                     envelope=envelope, fresh=fresh)


def _runtime_envelope(source, dims, inputs, outputs, names) -> dict[str, float]:
    """model_runs.runtime_envelope in the worker; none where onnxruntime's optimized session of
    the original fails (its own optimizer's failure is not a tolerance)."""
    try:
        with model_run("original", [dims], f"at onnxruntime's level all ({describe_setting(dims)})"):
            return isolation.call(model_runs.runtime_envelope, source, dict(dims), inputs, outputs,
                                  sorted(n for n in names if n in outputs))
    except FuseError:
        return {}


def _widest(*envelopes: Mapping[str, float]) -> dict[str, float]:
    widest: dict[str, float] = {}
    for envelope in envelopes:
        for name, bound in envelope.items():
            widest[name] = max(widest.get(name, 0.0), bound)
    return widest


_QUANTIZERS = {"QuantizeLinear", "DynamicQuantizeLinear"}


def outputs_after_quantizers(graph: onnx.GraphProto) -> set[str]:
    """The float graph outputs with a quantizer (QuantizeLinear, DynamicQuantizeLinear) upstream,
    in this graph (not inside a control-flow body)."""
    below: set[str] = set()
    for index in execution_order(graph):
        node = graph.node[index]
        if node.op_type in _QUANTIZERS or any(name in below for name in node.input):
            below.update(node.output)
    return {v.name for v in graph.output if v.name in below and v.type.tensor_type.elem_type in _FLOAT_TYPES}


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def compare_with_reference(reference: Reference, optimized: onnx.ModelProto | str, rtol: float | None = None,
                           atol: float | None = None, *, concurrent: bool = False) -> VerifyResult:
    """The candidate on the reference's inputs, run in the worker process (`concurrent`: its
    settings at once, see model_runs.candidate_runs). A candidate that fails to load or run
    where the original ran is a mismatch, never a shrug: that is a broken rewrite too; so is
    one that crashes onnxruntime."""
    if reference.error is not None:
        return VerifyResult((), UNVERIFIABLE, reference.error)
    settings = [(dims, feeds) for dims, feeds, _ in reference.runs]
    try:
        outcomes = _candidate_outcomes(sessions.source_of(optimized), settings, concurrent)
    except RuntimeCrash as crash:
        return VerifyResult((), MISMATCH, f"{crash} running the candidate", reference.settings)
    update("comparing the outputs")
    worst: dict[str, OutputComparison] = {}
    for (dims, _, expected), (actual, failure) in zip(reference.runs, outcomes):
        if failure is not None:
            return VerifyResult((), MISMATCH, f"the optimized model fails at {describe_setting(dims)} "
                                f"where the original runs: {failure}", reference.settings)
        compared = compare_outputs(expected, actual, rtol, atol, reference.computed_in, reference.steps,
                                   reference.envelope).outputs
        if rtol is None and atol is None:  # tolerances the user gave are kept to
            compared = _second_look(reference, dims, compared, expected, actual, optimized)
        for o in compared:
            if o.name not in worst or _badness(o) > _badness(worst[o.name]):
                worst[o.name] = o
    return replace(_verdict(list(worst.values()), reference.settings), settings_note=reference.note)


def _second_look(reference: Reference, dims: Mapping[str, int], compared: Sequence[OutputComparison],
                 expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                 optimized) -> Sequence[OutputComparison]:
    """`compared` (one setting's comparisons of `actual` with `expected`), with each output that
    may be a rounding flip (_flip_places) judged again on fresh inputs at that setting (see
    FLIP_FRACTION). It passes, saying so, where it is within its bounds there, or a flip again at
    none of the positions of the first (a rewrite wrong at some positions is wrong there on any
    inputs). Any other failure at the setting, or none, leaves the comparisons as they are."""
    failing = [o for o in compared if not o.passed]
    first = {o.name: _flip_places(o, expected[o.name], actual[o.name], reference) for o in failing}
    if not failing or any(places is None for places in first.values()):
        return compared
    fresh = reference.fresh_at(dims)
    if fresh is None or fresh.error is not None:
        return compared
    (_, feeds, fresh_expected), = fresh.runs
    try:
        (fresh_actual, failure), = _candidate_outcomes(sessions.source_of(optimized), [(dims, feeds)], False)
    except RuntimeCrash:
        return compared
    if failure is not None:
        return compared
    again = {o.name: o for o in compare_outputs(fresh_expected, fresh_actual, None, None, reference.computed_in,
                                                reference.steps, _widest(reference.envelope, fresh.envelope)).outputs}
    for o in failing:
        second = again[o.name]
        if second.passed:
            continue
        places = _flip_places(second, fresh_expected[o.name], fresh_actual[o.name], reference)
        if places is None or places & first[o.name]:
            return compared
    return [replace(o, passed=True, flipped_at=describe_setting(dims)) if not o.passed else o for o in compared]


def _flip_places(o: OutputComparison, want: np.ndarray, got: np.ndarray, reference: Reference) -> frozenset | None:
    """Where `o` (the comparison of `got` with `want`) is beyond its bounds, if that may be a
    rounding flip: an output after a quantizer, of the original's shape and NaN/inf, beyond its
    bounds in at most FLIP_FRACTION of its elements, each by at most FLIP_STEPS steps of a
    FLIP_GRID-level grid over the original's range; else None. A flip moves an element by a step
    of a quantizer's grid; a wrong clip or a wrong value at a few places moves it by more."""
    if (o.name not in reference.envelope or o.problem is not None or o.nonfinite_mismatches
            or not 0 < o.beyond <= FLIP_FRACTION * math.prod(o.shape)):
        return None
    w, g = np.asarray(want, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    finite = np.isfinite(w) & np.isfinite(g)
    excess = np.where(finite, np.abs(w - g) - (o.atol + o.rtol * np.abs(w)), 0.0)
    step = float(w[finite].max() - w[finite].min()) / FLIP_GRID if finite.any() else 0.0
    if (excess > FLIP_STEPS * step).any():
        return None
    return frozenset(np.flatnonzero(excess > 0).tolist())


def _candidate_outcomes(source: sessions.Source, settings: list, concurrent: bool) -> list:
    """model_runs.candidate_runs, a call per setting (none after a failure) so that each is
    timed, or one call for them all when `concurrent`."""
    if concurrent and len(settings) > 1:
        with model_run("candidate", [dims for dims, _ in settings], f"{len(settings)} settings at once"):
            return isolation.call(model_runs.candidate_runs, source, settings, True)
    outcomes = []
    for index, (dims, feeds) in enumerate(settings):
        with model_run("candidate", [dims], f"setting {index + 1} of {len(settings)} ({describe_setting(dims)})"):
            outcomes += isolation.call(model_runs.candidate_runs, source, [(dims, feeds)], False)
        if outcomes[-1][1] is not None:
            break
    return outcomes


# Operators whose output dtype is not their float inputs': the walk to an output's compute dtype stops there
_DTYPE_CHANGING = {"Cast", "CastLike", "Shape", "Size", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}


def computed_dtypes(graph: onnx.GraphProto) -> dict[str, np.dtype]:
    """The dtype each float output is computed in where that differs from its own: an output a
    Cast widens (onnxconverter_common's keep_io_types: Cast to fp16 at the inputs, Cast back at
    the outputs) is computed in the dtype of what feeds the Cast, found by walking up through
    the producers to the first tensor whose float type is known (a declared type, an
    initializer, a Cast's target)."""
    known: dict[str, int] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            known[value.name] = value.type.tensor_type.elem_type
    known.update({t.name: t.data_type for t in graph.initializer})
    producer = {o: n for n in graph.node for o in n.output if o}
    for node in graph.node:
        if node.op_type == "Cast" and node.output:
            known.setdefault(node.output[0], next(a.i for a in node.attribute if a.name == "to"))
    result = {}
    for output in graph.output:
        cast = producer.get(output.name)
        if cast is None or cast.op_type != "Cast" or output.name not in known:
            continue
        inner = _float_dtype_upstream(cast.input[0], known, producer)
        own = onnx.helper.tensor_dtype_to_np_dtype(known[output.name])
        if inner is not None and own.kind == "f" and inner.kind == "f" and inner.itemsize < own.itemsize:
            result[output.name] = inner
    return result


def quantized_output_steps(graph: onnx.GraphProto) -> dict[str, float]:
    """The quantization step of each output a DequantizeLinear writes with a constant scale: the
    largest of its scales (per axis, one per channel)."""
    scales = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}
    steps = {}
    for output in graph.output:
        node = producer.get(output.name)
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in scales:
            scale = onnx.numpy_helper.to_array(scales[node.input[1]])
            if scale.size and np.issubdtype(scale.dtype, np.floating):
                steps[output.name] = float(np.abs(scale.astype(np.float64)).max())
    return steps


def _float_dtype_upstream(name: str, known: Mapping[str, int], producer: Mapping[str, onnx.NodeProto],
                          limit: int = 64) -> np.dtype | None:
    queue, seen = [name], {name}
    while queue and limit > 0:
        tensor, limit = queue.pop(0), limit - 1
        if tensor in known:
            dtype = _np_dtype(known[tensor])
            if dtype is not None and dtype.kind == "f":
                return dtype
            continue
        node = producer.get(tensor)
        if node is None or node.op_type in _DTYPE_CHANGING:
            continue
        for source in node.input:
            if source and source not in seen:
                seen.add(source)
                queue.append(source)
    return None


def _np_dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        return None


def _badness(o: OutputComparison) -> tuple:
    return (not o.passed, o.flipped_at is not None, o.all_nonfinite, o.max_abs_diff)


def reference_for(original: onnx.ModelProto | str, header: onnx.ModelProto, dims: Mapping[str, int] | None = None,
                  *, seed: int = 0, int_ranges: Mapping[str, tuple[int, int]] | None = None) -> Reference:
    """The original's outputs at the first candidate of input_domain.shape_settings it accepts,
    integers in the ranges its graph implies (`int_ranges` winning). `header`: the original as
    loaded (only its graph is read); `original` is what onnxruntime loads."""
    return reference_plan(header, dims, int_ranges=int_ranges).run(original, seed=seed)


@dataclass(frozen=True)
class ReferencePlan:
    """What the original's reference runs need from its graph, read up front: the candidate
    settings in order (input_domain.shape_settings), the single settings derived from the model
    to try when none of them runs (input_domain.derived_settings, each with its origin), and the
    integer inputs' ranges. `run` then reads only the model onnxruntime loads, so it can go on
    while the graph is rewritten."""

    candidates: tuple[tuple[dict[str, int], ...], ...]
    int_ranges: Mapping[str, tuple[int, int] | None]
    derived: tuple[tuple[dict[str, int], str], ...] = ()
    free: tuple[str, ...] = ()  # the free dims, which two derived settings must both change
    branches: tuple[str, ...] = ()  # bool inputs selecting an If's branch (input_domain.branch_inputs)

    def run(self, original: onnx.ModelProto | str, *, seed: int = 0) -> Reference:
        first = None
        for settings in self.candidates:
            reference = reference_outputs(original, settings, seed=seed, int_ranges=self.int_ranges)
            if reference.error is None:
                if self.free and len({tuple(dims.get(k) for k in self.free) for dims, _, _ in reference.runs}) == 1:
                    # the bound setting alone (--dim for every symbol; the primes failed beside it)
                    return self._derived(original, seed, reference) or reference
                return reference
            first = first or reference
        if first is None or _NOT_ABOUT_SIZES.search(first.error):
            return first  # no size makes an unsupported operator run: no more loads of the original
        derived = self._derived(original, seed)
        if derived is None and self.derived:
            return replace(first, error=f"{first.error}; nor at any of {len(self.derived)} settings derived from "
                                        f"the model (its strides, declared and common sizes)")
        return derived or first

    def _derived(self, original: onnx.ModelProto | str, seed: int, bound: Reference | None = None) -> Reference | None:
        """After `bound` (the user's setting, when it ran alone) or the first derived setting the
        original runs at, the first derived one that changes every free dim (else the first that
        changes some: a model that takes batch 1 only); one run of the original per setting
        tried; one setting, said so, where no second runs."""
        found: list[tuple[Reference, str]] = [(bound, "")] if bound is not None else []
        partial = None
        for setting, origin in self.derived:
            if found:
                shared = [key for key in self.free if found[0][0].runs[0][0].get(key) == setting.get(key)]
                if len(shared) == len(self.free) or shared and partial is not None:
                    continue
            values = _branch_values(self.branches, len(found))
            reference = reference_outputs(original, [{**setting, **values}], seed=seed, int_ranges=self.int_ranges)
            if reference.error is not None:
                continue
            if found and shared:
                partial = (reference, origin, shared)
                continue
            found.append((reference, origin))
            if len(found) == 2:
                break
        if len(found) == 1 and partial is not None:
            found.append(partial[:2])
        if bound is not None and len(found) == 1:
            return None
        if not found:
            return None
        runs = tuple(reference_run for reference, _ in found for reference_run in reference.runs)
        computed, fresh = found[0][0].computed_in, found[0][0].fresh
        envelope = _widest(*(reference.envelope for reference, _ in found))
        where = " and ".join(dict.fromkeys(origin.removeprefix("derived from the model: ") for _, origin in found
                                           if origin))
        same = (f" ({', '.join(partial[2])} the same at both: no setting that changes it runs)"
                if partial is not None and found[1][0] is partial[0] else "")
        if bound is not None:
            return Reference(runs, note=f"the bound setting, and one derived from the model: {where}{same}",
                             computed_in=computed, steps=found[0][0].steps, envelope=envelope, fresh=fresh)
        if len(found) == 2:
            return Reference(runs, note=f"the distinct primes fail on the original; settings derived from the "
                                        f"model: {where}{same}", computed_in=computed, steps=found[0][0].steps,
                             envelope=envelope, fresh=fresh)
        if self.branches:  # the one setting again with the other branch taken
            other = reference_outputs(original, [{**runs[0][0], **_branch_values(self.branches, 1)}],
                                      seed=seed, int_ranges=self.int_ranges)
            runs += other.runs
            envelope = _widest(envelope, other.envelope)
        return Reference(runs, note=f"the distinct primes fail on the original; only one setting derived from "
                                    f"the model runs ({where}), so one size setting was verified", computed_in=computed,
                         steps=found[0][0].steps, envelope=envelope, fresh=fresh)


# Failures no input size changes: an operator onnxruntime does not know or has no kernel for, a
# type error, a file it cannot parse or find; and a crash, which is not tried again (each costs a
# new worker process, and what crashed is the runtime, not the sizes)
_NOT_ABOUT_SIZES = re.compile(r"NOT_IMPLEMENTED|is not a registered function/op|Type Error|INVALID_PROTOBUF|NO_SUCHFILE"
                              r"|NO_MODEL|onnxruntime crashed")


def _branch_values(branches: Sequence[str], index: int) -> dict[str, int]:
    """Setting `index`'s values of the bool inputs that select a branch: true, then false."""
    return {value_key(name): int(index % 2 == 0) for name in branches}


def _with_branches(settings: Sequence[dict[str, int]], branches: Sequence[str]) -> tuple[dict[str, int], ...]:
    """Each setting with its branch values; a lone setting twice, so that both values run."""
    if not branches:
        return tuple(settings)
    settings = list(settings) * (2 if len(settings) == 1 else 1)
    return tuple({**setting, **_branch_values(branches, index)} for index, setting in enumerate(settings))


def reference_plan(header: onnx.ModelProto, dims: Mapping[str, int] | None = None, *,
                   int_ranges: Mapping[str, tuple[int, int]] | None = None) -> ReferencePlan:
    ranges = {**integer_ranges(header), **(int_ranges or {})}
    dims = binding(header, dims or {}, {})
    branches = tuple(branch_inputs(header))
    free = [key for key in free_symbols(header) if key not in dims]
    # every symbol bound: a second setting may still be derived over all of them
    derived = derived_settings(header, dims if free else {})
    return ReferencePlan(tuple(_with_branches(settings, branches) for settings in shape_settings(header, dims)),
                         ranges, tuple(derived), tuple(free or free_symbols(header)), branches)


def verify_models(original: onnx.ModelProto | str, optimized: onnx.ModelProto | str, *,
                  dims: Mapping[str, int] | None = None, seed: int = 0, rtol: float | None = None,
                  atol: float | None = None, feeds: Mapping[str, np.ndarray] | None = None,
                  int_ranges: Mapping[str, tuple[int, int]] | None = None,
                  header: onnx.ModelProto | None = None) -> VerifyResult:
    """Run both on the same inputs and compare: given `feeds`, or seeded random inputs at
    distinct sizes for distinct symbols (see reference_for). `header`: the original, already
    loaded by the caller, to save reading the file again."""
    if feeds:
        reference = reference_outputs(original, [], feeds=feeds)
    else:
        if header is None:
            # weights by reference
            header = original if isinstance(original, onnx.ModelProto) else read_original(original)
        reference = reference_for(original, header, dims, seed=seed, int_ranges=int_ranges)
    return compare_with_reference(reference, optimized, rtol, atol)


def parse_int_ranges(items) -> dict[str, tuple[int, int]]:
    """`input_ids=0:30522` -> {"input_ids": (0, 30522)} (high exclusive)."""
    ranges = {}
    for item in items:
        name, _, span = item.rpartition("=")
        low, sep, high = span.partition(":")
        try:
            if not name or not sep:
                raise ValueError
            ranges[name] = (int(low), int(high))
        except ValueError:
            raise FuseError(f"--int-range expects INPUT=LOW:HIGH, got {item!r}") from None
        if ranges[name][0] >= ranges[name][1]:
            raise FuseError(f"--int-range {item}: LOW must be below HIGH")
    return ranges


def load_inputs(path) -> dict[str, np.ndarray]:
    """Real inputs: a .npz archive keyed by input name, or a folder of TensorProto .pb files
    (the tensor's own name, else the file's stem, names the input)."""
    from pathlib import Path

    from onnx import numpy_helper

    path = Path(path)
    try:
        if path.is_dir():
            feeds = {}
            for pb in sorted(path.glob("*.pb")):
                tensor = onnx.TensorProto()
                tensor.ParseFromString(pb.read_bytes())
                if tensor.data_location == onnx.TensorProto.EXTERNAL:
                    # onnx would read it from a file named in the tensor, relative to the working folder
                    raise FuseError(f"{pb}: the tensor names external data; input files must hold their values")
                feeds[tensor.name or pb.stem] = numpy_helper.to_array(tensor)
            if not feeds:
                raise FuseError(f"{path}: no .pb tensor files in this folder")
            return feeds
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except FuseError:
        raise
    except (OSError, ValueError) as exc:
        raise FuseError(f"{path}: cannot read inputs ({str(exc).splitlines()[0][:200]})") from exc
