"""Run an original and an optimized model on the same inputs in onnxruntime and compare outputs.

Results carry statistics per output (max abs/rel difference, cosine similarity), not a bool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from fuse_cli.errors import FuseError

# (rtol, atol) by output dtype: fp32 per the project standard; fp16/bf16 keep ~3 significant digits.
# The default atol is scaled by the output's magnitude (see compare_outputs).
DEFAULT_TOLERANCES = {
    np.dtype(np.float64): (1e-6, 1e-8),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float16): (1e-2, 1e-3),
}


@dataclass(frozen=True)
class OutputComparison:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_rel_diff: float
    cosine_similarity: float
    rtol: float
    atol: float
    passed: bool


@dataclass(frozen=True)
class VerifyResult:
    outputs: tuple[OutputComparison, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def failing(self) -> tuple[OutputComparison, ...]:
        return tuple(o for o in self.outputs if not o.passed)


DEFAULT_DIM = 2  # a symbolic dim's value in random inputs when none is given


def make_session(model: onnx.ModelProto | str, *, optimize: bool = False, providers=("CPUExecutionProvider",),
                 dims: Mapping[str, int] | None = None):
    """An onnxruntime session that runs the graph as written (graph optimizations off by default,
    so a comparison tests our rewrite, not onnxruntime's own fusions). `dims` pins symbolic input
    dims by name: onnxruntime's session creation is quadratic in the node count while inputs
    have free dims (a 12k-node stack: 40 s, pinned 0.5 s)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    for name, value in (dims or {}).items():
        options.add_free_dimension_override_by_name(name, int(value))
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        return ort.InferenceSession(source, options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own exception types
        raise FuseError(f"onnxruntime cannot load the model: {str(exc).splitlines()[0][:300]}") from exc


def random_inputs(session, *, dims: Mapping[str, int] | None = None, seed: int = 0,
                  int_ranges: Mapping[str, tuple[int, int]] | None = None,
                  default_dim: int = DEFAULT_DIM) -> dict[str, np.ndarray]:
    """Seeded random data for every input, respecting dtype and shape. Symbolic dims come from
    `dims`, else `default_dim`; integers from `int_ranges[name]` (low inclusive, high exclusive)."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    int_ranges = int_ranges or {}
    feeds = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else dims.get(d, default_dim) if isinstance(d, str) else default_dim
                 for d in inp.shape]
        dtype = _numpy_dtype(inp.type)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[inp.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            low, high = int_ranges.get(inp.name, _default_int_range(inp.name))
            feeds[inp.name] = rng.integers(low, high, shape).astype(dtype)
    return feeds


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def _numpy_dtype(ort_type: str) -> np.dtype:
    if ort_type not in _ORT_TYPES:
        raise FuseError(f"cannot make random data for an input of type {ort_type}; pass real inputs")
    return np.dtype(_ORT_TYPES[ort_type])


def compare_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    rtol: float | None = None, atol: float | None = None) -> VerifyResult:
    """Per output: |got - want| <= atol + rtol * |want| elementwise.

    A given `atol` is absolute. The default one scales with the output's largest magnitude (when
    that exceeds 1): a float32 sum of many terms carries rounding error in proportion to the
    terms, so an element near zero in logits of magnitude 10 legitimately differs by more than
    1e-5 after a correct fold (resnet50: 3.5e-5, the same as PyTorch vs onnxruntime on the
    unfused model), while a real error (eps dropped, a wrong axis) is orders of magnitude larger.
    """
    results = []
    for name, want in expected.items():
        if name not in actual:
            raise FuseError(f"the optimized model has no output named {name!r}")
        want = np.asarray(want)
        default_rtol, default_atol = DEFAULT_TOLERANCES.get(want.dtype, (0.0, 0.0))
        r = rtol if rtol is not None else default_rtol
        a = atol if atol is not None else default_atol * _magnitude(want)
        results.append(_compare_one(name, want, np.asarray(actual[name]), r, a))
    return VerifyResult(tuple(results))


def _magnitude(values: np.ndarray) -> float:
    if values.dtype.kind not in "fc" or values.size == 0:
        return 1.0
    finite = np.abs(values[np.isfinite(values)])
    return max(1.0, float(finite.max())) if finite.size else 1.0


def _compare_one(name: str, want: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> OutputComparison:
    if want.shape != got.shape or want.dtype != got.dtype:
        return OutputComparison(name, f"{want.dtype} vs {got.dtype}", tuple(want.shape), float("inf"), float("inf"),
                                0.0, rtol, atol, False)
    if want.dtype.kind in "fc":
        w, g = want.astype(np.float64), got.astype(np.float64)
        # NaN where the original has NaN, and the same infinity, are agreement, not a difference
        same_special = (np.isnan(w) & np.isnan(g)) | (np.isinf(w) & (w == g))
        with np.errstate(invalid="ignore"):
            diff = np.where(same_special, 0.0, np.abs(w - g))
        max_abs = float(diff.max()) if diff.size else 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
        max_rel = float(np.where(diff == 0, 0.0, rel).max()) if diff.size else 0.0
        norms = np.linalg.norm(w.ravel()) * np.linalg.norm(g.ravel())
        cosine = float(np.dot(np.nan_to_num(w.ravel()), np.nan_to_num(g.ravel())) / norms) if norms > 0 else 1.0
        # an infinite original value matches only itself (inf <= atol + rtol * inf would pass anything)
        passed = bool(np.all(same_special | (np.isfinite(w) & (diff <= atol + rtol * np.abs(w)))))
    else:
        equal = want == got
        max_abs = float(np.abs(want.astype(np.float64) - got.astype(np.float64)).max()) if want.size else 0.0
        max_rel, cosine, passed = max_abs, 1.0 if equal.all() else 0.0, bool(equal.all())
    return OutputComparison(name, str(want.dtype), tuple(want.shape), max_abs, max_rel, cosine, rtol, atol, passed)


def run(session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, dict(feeds))
    except Exception as exc:
        raise FuseError(f"onnxruntime failed to run the model: {str(exc).splitlines()[0][:300]}") from exc
    return dict(zip(names, values))


def verify_models(original: onnx.ModelProto | str, optimized: onnx.ModelProto | str, *,
                  dims: Mapping[str, int] | None = None, seed: int = 0, rtol: float | None = None,
                  atol: float | None = None, feeds: Mapping[str, np.ndarray] | None = None,
                  int_ranges: Mapping[str, tuple[int, int]] | None = None) -> VerifyResult:
    """Run both on the same inputs, one session at a time (on a model of several GB, two sessions
    at once would hold the weights twice). Random inputs take `dims` (see `pinned_dims`), which
    also pin the sessions' free dims; given `feeds` take their own shapes."""
    pins = None if feeds else dims
    before = make_session(original, dims=pins)
    feeds = feeds or random_inputs(before, dims=dims, seed=seed, int_ranges=int_ranges)
    expected = run(before, feeds)
    del before
    after = make_session(optimized, dims=pins)
    after_inputs = {i.name for i in after.get_inputs()}
    actual = run(after, {k: v for k, v in feeds.items() if k in after_inputs})
    return compare_outputs(expected, actual, rtol, atol)


def pinned_dims(model: onnx.ModelProto, dims: Mapping[str, int] | None = None,
                default: int = DEFAULT_DIM) -> dict[str, int]:
    """Every named symbolic dim of the graph inputs at the value random inputs give it: `dims`,
    else `default`. Passed as verify_models' dims, it lets onnxruntime build both sessions with
    fixed shapes."""
    pinned = dict(dims or {})
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param and not dim.HasField("dim_value"):
                pinned.setdefault(dim.dim_param, default)
    return pinned


def _default_int_range(name: str) -> tuple[int, int]:
    """Masks take 0/1: exporters compute (1 - mask) * finfo.min, which overflows to inf (and NaN
    logits) for any other value, making the original model's outputs useless for comparison."""
    return (0, 2) if "mask" in name.lower() else (0, 10)


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
