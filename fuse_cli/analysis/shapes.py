"""Tensor shapes and sizes for every value of the top-level graph.

Sizes feed the memory audit, so the one rule here is exactness: a size is either computed from
fully known dims and a known element type, or it is None and the reason is listed in
`ShapeTable.unknown_dims`. Nothing is ever assumed to be 1 or 0.

onnx's shape inference does the work. Around it this module
- binds the symbolic input dims the user supplies (`--dim batch=4`, `--input-shape x=1,3,224,224`),
- runs it on a light copy of the model, so the caller's model is never touched and models over
  protobuf's 2 GB limit still go through (big tensor payloads are left out: inference_runs.py),
- degrades instead of crashing: custom-domain operators, opsets newer than onnx knows and models
  that make inference fail just leave some tensors unknown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import onnx
from onnx import helper

from fuse_cli.analysis.inference_runs import (bind, inference_copy, run_inference, runtime_symbolic_inference,
                                              static_shapes_as_constants)
from fuse_cli.analysis.shape_values import as_constant_nodes, evaluate_shape_values, initial_values
from fuse_cli.core.tensors import element_size_bits
from fuse_cli.input_domain import (  # the distinct primes verification binds; the inputs' binding keys
    free_symbols, input_dim_keys, shape_settings, with_computed_dims, with_declared_arithmetic)

Dim = int | str | None
_NO_BINDINGS: Mapping = MappingProxyType({})

# Rounds of shape arithmetic evaluated between inferences (shape_values.py): a value computed in
# one round sizes a Shape read in the next. timm's Swin needs one per stage and block kind.
_SHAPE_VALUE_ROUNDS = 32
# How many times a Shape made known (static_shapes_as_constants) may make another one's input static.
_STATIC_SHAPE_ROUNDS = 4


@contextlib.contextmanager
def paused_gc():
    """The cyclic garbage collector off for a walk that allocates many small acyclic objects
    (per-tensor tuples and dicts): its collections rescan everything the process holds and cost
    a third of the memory audit at 12k nodes. Reference counting still frees everything."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class TensorInfo:
    """What is known about one tensor.

    `shape` is None when even the rank is unknown; inside it an int is a known dim, a str a
    symbolic dim the user has not bound, and None a dim nothing is known about.
    """

    name: str
    elem_type: int
    shape: tuple[Dim, ...] | None

    def nbytes(self) -> int | None:
        """Size in bytes, or None unless the element type and every dim are known.

        Sub-byte types are packed (two int4 per byte), so the total is rounded up once, not per
        element.
        """
        bits = element_size_bits(self.elem_type)
        if bits is None or self.shape is None:
            return None
        if not all(isinstance(d, int) for d in self.shape):
            return None
        return (math.prod(self.shape) * bits + 7) // 8


@dataclass(frozen=True)
class UnknownDim:
    """One reason a tensor's size is unknown.

    `dim` is None when the rank itself is unknown. `symbol` is the model's own name for the dim
    (bindable with `dims`); None when the dim is anonymous or a placeholder onnx made up.
    """

    tensor: str
    dim: int | None
    symbol: str | None


@dataclass(frozen=True)
class ShapeTable:
    """Shapes of every top-level value: graph inputs and outputs, node outputs, initializers.

    `bound_dims` holds the symbol values in effect (given in `dims` or implied by
    `input_shapes`); `unused_dims` the names in `dims` that no dim of the model carries (likely a
    typo, worth a warning); `warnings` what went wrong inside onnx's shape inference.
    """

    tensors: Mapping[str, TensorInfo]
    unknown_dims: tuple[UnknownDim, ...]
    bound_dims: Mapping[str, int] = field(default_factory=dict)
    unused_dims: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # Tensors where onnx's inference wrote a placeholder symbol of its own (unk__N) for a dim it
    # could not infer, or where onnxruntime's symbolic inference named a dim onnx left unknown:
    # per dim that placeholder (None for the dims onnx knew). Equal placeholders say which
    # unknown dim onnx copied from which (the memory model needs that, see planner_shapes.py).
    # None: onnx could not even infer the rank (onnxruntime's symbolic inference filled it in).
    placeholders: Mapping[str, tuple[Dim, ...] | None] = field(default_factory=dict)

    def get(self, name: str) -> TensorInfo | None:
        return self.tensors.get(name)

    def nbytes(self, name: str) -> int | None:
        info = self.tensors.get(name)
        return None if info is None else info.nbytes()


def infer_shapes(
    model: onnx.ModelProto,
    dims: Mapping[str, int] = _NO_BINDINGS,
    input_shapes: Mapping[str, Sequence[int]] = _NO_BINDINGS,
    *,
    symbolic: bool = False,
    data_propagation: bool = True,
    outputs_declared: bool = True,
) -> ShapeTable:
    """Infer every top-level tensor's shape after binding the user's dims; `model` is not modified.

    `dims` binds symbolic dims by name (dim_param) everywhere in the graph. `input_shapes` gives
    whole input shapes; where an input declares a symbol, the value binds that symbol for the
    whole graph too (batch given for `input_ids` also sizes `attention_mask`). Raises ValueError
    for bindings that contradict the model or each other.

    `symbolic=True` also runs onnxruntime's symbolic shape inference (after binding) and takes
    from it only what onnx's inference left unknown. onnx's own loses the symbol wherever an exporter computes a dim
    (BERT's position embeddings are sliced to Min(512, sequence): every activation after them
    becomes [?, ?, 768]); onnxruntime's keeps `batch`/`sequence` through such arithmetic by merging
    dims that a valid model needs equal, and names the dims it creates consistently. Its symbols
    are kept, but never override what onnx knows: its merging assumes that dims which broadcast
    against each other are equal, which is wrong where one of them may be 1 ([batch, 3] * [2, 3]
    would make batch 2), so onnx's dims stand wherever onnx has them. `fuse optimize` verifies
    every rewrite numerically besides.

    `data_propagation=False` infers as onnxruntime's own graph inference does (what its memory
    planner compares): shapes read from the values of tensors computed at run time stay unknown.

    `outputs_declared=False` sets aside the graph outputs' declared shapes where they name a dim no
    input carries (inference_runs.outputs_inferred): sizes, not names, for the memory estimate.
    """
    with paused_gc():
        return _infer_shapes(model, dims, input_shapes, symbolic, data_propagation, outputs_declared)


def _infer_shapes(model: onnx.ModelProto, dims: Mapping[str, int], input_shapes: Mapping[str, Sequence[int]],
                  symbolic: bool, data_propagation: bool, outputs_declared: bool = True) -> ShapeTable:
    declared = _declared_symbols(model.graph)
    keys = input_dim_keys(model)
    bindings = _resolve_bindings(model.graph, dims, input_shapes, keys)
    unused = tuple(name for name in dims if name not in declared and name not in keys.values())

    copy = inference_copy(model, outputs_declared=outputs_declared)
    bind(copy.graph, bindings, input_shapes, keys)
    inferred, warnings = run_inference(copy, data_propagation)
    if not data_propagation:
        for _ in range(_STATIC_SHAPE_ROUNDS):
            if not static_shapes_as_constants(copy, inferred):
                break
            inferred, warnings = run_inference(copy, False)

    placeholders: dict[str, tuple[Dim, ...]] = {}
    tensors = _collect(model.graph, inferred.graph, bindings, declared, placeholders)
    if data_propagation and any(info.shape is None or None in info.shape for info in tensors.values()):
        resolved = _with_shape_values(copy, inferred)
        if resolved is not None:
            inferred, placeholders = resolved, {}
            tensors = _collect(model.graph, inferred.graph, bindings, declared, placeholders)
    tensors = _with_control_flow_outputs(model, copy, tensors, bindings, declared, data_propagation)
    table = ShapeTable(
        tensors=MappingProxyType(tensors),
        unknown_dims=_all_unknown_dims(tensors),
        bound_dims=MappingProxyType(dict(bindings)),
        unused_dims=unused,
        warnings=warnings,
        placeholders=MappingProxyType(placeholders),
    )
    return with_runtime_dims(model, table, input_shapes) if symbolic else table


def _with_control_flow_outputs(model: onnx.ModelProto, copy: onnx.ModelProto, tensors: dict[str, TensorInfo],
                               bindings: Mapping[str, int], declared: set[str], data_propagation: bool
                               ) -> dict[str, TensorInfo]:
    """`tensors` with the outputs of If, Loop and Scan nodes that onnx leaves unknown (a Loop's;
    an If's whose branches differ in rank) taken from the body that runs at these dims
    (analysis/bodies.py), declared in `copy` and inferred again, so that what reads them is sized
    too; a round per control-flow node that reads another's output."""
    if not any(node.op_type in _CONTROL_FLOW for node in model.graph.node):
        return tensors
    from fuse_cli.analysis.bodies import control_flow_outputs  # bodies infers each body through this module

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    known: set[str] = set()
    for _ in range(_CONTROL_FLOW_ROUNDS):
        table = ShapeTable(MappingProxyType(tensors), ())
        found = {name: info for name, info in control_flow_outputs(model.graph, table, opset).items()
                 if name not in known}
        if not found:
            break
        known.update(found)
        # a graph output's own declaration is the one inference reads (it hides value_info)
        for output in copy.graph.output:
            if output.name in found:
                output.CopyFrom(helper.make_tensor_value_info(output.name, found[output.name].elem_type,
                                                              list(found[output.name].shape)))
        outputs = {output.name for output in copy.graph.output}
        copy.graph.value_info.extend(helper.make_tensor_value_info(name, info.elem_type, list(info.shape))
                                     for name, info in found.items() if name not in outputs)
        inferred, _ = run_inference(copy, data_propagation)
        tensors = _collect(model.graph, inferred.graph, bindings, declared)
    return tensors


_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
_CONTROL_FLOW_ROUNDS = 8


def with_runtime_dims(model: onnx.ModelProto, table: ShapeTable,
                      input_shapes: Mapping[str, Sequence[int]] = _NO_BINDINGS, *, proofs: bool = False) -> ShapeTable:
    """`table` (an infer_shapes result for `model`) with the dims onnx left unknown taken from
    onnxruntime's symbolic inference (see infer_shapes), without running onnx's inference again.

    proofs=True: the table fusion checks reason with, where an equal name must mean an equal
    size. onnxruntime's symbolic inference cannot give that: it merges two symbols that meet in
    a broadcast ([N, 4] + [M, 4] names the sum's dim N or M, by hash seed, and renames every M
    N), where a valid model only needs N == M or one of them 1. So for proofs no symbol is
    merged: onnxruntime's inference runs twice with every free input symbol bound to a distinct
    prime (the two settings verification uses), and a dim onnx left unknown is named by the two
    sizes it takes: an input symbol's name when they are that symbol's sizes, else a name of its
    own that only a dim of the same two sizes shares (never a number, even where both sizes are
    one: a round-up of N to a multiple of 8 is 8 at both settings, and 16 at N = 9).
    Where a setting is not a valid input (N and M must then be equal, or 1), nothing is filled."""
    if not any(info.shape is None or None in info.shape for info in table.tensors.values()):
        return table
    if proofs:
        return _with_evaluated_dims(model, table, input_shapes)
    runtime = runtime_symbolic_inference(model, table.bound_dims, input_shapes)
    if runtime is None:
        return table
    own = _declared_symbols(model.graph)
    more = _collect(model.graph, runtime.graph, table.bound_dims, own | _all_symbols(runtime.graph))
    # A dim it could not compute it names after the node (Pad_49_o0__d1): no symbol of the model,
    # nothing a user can bind, so unknown; and so is arithmetic over such names.
    more = {name: _only_symbols_of(info, own) for name, info in more.items()}
    tensors = {name: _fill_unknown(info, more.get(name)) for name, info in table.tensors.items()}
    # What onnxruntime's symbolic inference named, onnxruntime's own graph inference (what its
    # memory planner compares) does not: mark the filled dims as onnx's unknowns.
    placeholders = dict(table.placeholders)
    for name, info in table.tensors.items():
        filled = tensors[name]
        if filled is info or filled.shape == info.shape:
            continue
        if info.shape is None:
            placeholders[name] = None
        else:
            raw = placeholders.get(name) or (None,) * len(info.shape)
            placeholders[name] = tuple(r if r is not None or d is not None else f"?{name}:{k}"
                                       for k, (d, r) in enumerate(zip(info.shape, raw)))
    return dataclasses.replace(table, tensors=MappingProxyType(tensors), unknown_dims=_all_unknown_dims(tensors),
                               placeholders=MappingProxyType(placeholders))


def at_dims(table: ShapeTable, dims: Mapping[str, int]) -> ShapeTable | None:
    """`table`, onnx's inference with nothing bound, at `dims`, by substitution: where that
    inference named every dim of every tensor by a symbol `dims` binds or a number, inferring
    again at `dims` gives exactly that (binding only settles what a symbol could not: a Squeeze
    of a maybe-1 dim, a broadcast of two symbols, which leave a dim or a rank unknown here). None
    where anything is unknown, a placeholder of onnx's or onnxruntime's, or a symbol `dims` does
    not bind (a declared intermediate's own name): then only an inference can say. One
    inference of a 12k-node graph takes 0.2 s; this, a walk over its tensors.

    Never the proofs table (with_runtime_dims, proofs=True): it names a dim onnx left unknown by
    its sizes at two prime settings, which Max(N, 3) or a round-up to a multiple of 8 match
    there and nowhere else (at N = 1, at N = 64)."""
    if table.placeholders or table.bound_dims:
        return None
    tensors: dict[str, TensorInfo] = {}
    for name, info in table.tensors.items():
        if not info.elem_type or info.shape is None:
            return None
        shape = tuple(d if isinstance(d, int) else dims.get(d) for d in info.shape)
        if None in shape:
            return None
        tensors[name] = TensorInfo(name, info.elem_type, shape)
    return ShapeTable(tensors=MappingProxyType(tensors), unknown_dims=(), bound_dims=MappingProxyType(dict(dims)),
                      warnings=table.warnings)


def _with_evaluated_dims(model: onnx.ModelProto, table: ShapeTable,
                         input_shapes: Mapping[str, Sequence[int]]) -> ShapeTable:
    settings = shape_settings(model, table.bound_dims)[0]
    try:
        # With every input dim a number, onnx's data propagation resolves most computed shapes;
        # onnxruntime's inference runs only for what it leaves unknown (and merges numbers only).
        evaluated = [infer_shapes(model, setting, input_shapes, symbolic=True).tensors for setting in settings]
    except ValueError:  # a setting that contradicts a fixed input dim
        return table
    # the input symbols' sizes, and those of the arithmetic dims the graph declares (a decode step's
    # `past_sequence + sequence`), name the dims that take them
    named_settings = [with_declared_arithmetic(model, setting) for setting in settings]
    by_sizes: dict[tuple, str] = {}
    for name in named_settings[0]:  # an input symbol first, where sizes coincide
        if name not in table.bound_dims and all(name in s for s in named_settings):
            by_sizes.setdefault(tuple(s[name] for s in named_settings), name)

    far: list[Mapping[str, TensorInfo] | None] = []  # a third setting's sizes, inferred on first need

    def named(sizes: tuple, tensor: str, index: int) -> Dim:
        if not all(isinstance(size, int) for size in sizes):
            return None
        if len(set(sizes)) == 1:
            # One size at both settings: a constant, or a round-up or clamp of a symbol the two
            # settings happen to share (N rounded up to a multiple of 8 is 8 at N = 3 and N = 5;
            # taken for a number, static-shape-dims folded it, and verification at those settings
            # agreed with the wrong output). A number only when a third setting, every free
            # symbol a prime above 200, keeps it too; else a name.
            if not far:
                far.append(_far_sizes(model, table.bound_dims, input_shapes))
            at_far = far[0].get(tensor) if far[0] is not None else None
            if at_far is not None and at_far.shape is not None and len(at_far.shape) > index \
                    and at_far.shape[index] == sizes[0]:
                return sizes[0]
        return by_sizes.get(sizes, "dim(" + "|".join(map(str, sizes)) + ")")

    tensors = dict(table.tensors)
    for name, info in table.tensors.items():
        found = [e.get(name) for e in evaluated]
        if any(f is None or f.shape is None for f in found) or len({len(f.shape) for f in found}) != 1:
            continue
        # onnx's own dims stand; only the ones it left unknown are named (and only they may cost
        # the far setting's inference)
        known = info.shape if info.shape is not None and len(info.shape) == len(found[0].shape) else None
        dims = tuple(known[k] if known is not None and known[k] is not None else named(sizes, name, k)
                     for k, sizes in enumerate(zip(*(f.shape for f in found))))
        if info.shape is None:
            tensors[name] = TensorInfo(name, info.elem_type or found[0].elem_type, dims)
        elif known is not None:
            tensors[name] = TensorInfo(name, info.elem_type, dims)
    return dataclasses.replace(table, tensors=MappingProxyType(tensors), unknown_dims=_all_unknown_dims(tensors))


def _far_sizes(model: onnx.ModelProto, bound: Mapping[str, int],
               input_shapes: Mapping[str, Sequence[int]]) -> Mapping[str, TensorInfo] | None:
    """The sizes at a setting far from verification's: every free symbol a distinct prime above
    200 (None where the model refuses it). Not above 1000: past a model's limits (BERT's 512
    positions) onnx's inference fails and onnxruntime's symbolic one runs, 0.64 s on BERT-base
    against 0.05 s here; round-ups to multiples up to 128 and clamps below 211 still show."""
    free = [name for name in free_symbols(model) if name not in bound]
    primes = (n for n in itertools.count(_FAR) if all(n % p for p in range(2, int(n ** 0.5) + 1)))
    try:
        return infer_shapes(model, with_computed_dims(model, {**bound, **dict(zip(free, primes))}), input_shapes,
                            symbolic=True).tensors
    except ValueError:
        return None


_FAR = 211  # a prime: the first size of the far setting

_FUNCTIONS = frozenset({"Min", "Max", "floor", "ceiling", "Mod", "Abs", "sqrt"})


def _only_symbols_of(info: TensorInfo, symbols: set[str]) -> TensorInfo:
    if info.shape is None or all(not isinstance(d, str) for d in info.shape):
        return info
    return TensorInfo(info.name, info.elem_type, tuple(
        d if not isinstance(d, str) or d in symbols or all(word in symbols or word in _FUNCTIONS
                                           for word in re.findall(r"[A-Za-z_][\w.]*", d)) else None
        for d in info.shape))


def _all_unknown_dims(tensors: Mapping[str, TensorInfo]) -> tuple[UnknownDim, ...]:
    return tuple(reason for name, info in tensors.items() for reason in _unknown_dims(name, info))


def _fill_unknown(info: TensorInfo, other: TensorInfo | None) -> TensorInfo:
    """`info` with its unknown dtype, rank or single dims taken from `other`; known ones stand."""
    if other is None:
        return info
    elem_type = info.elem_type or other.elem_type
    if info.shape is None:
        return TensorInfo(info.name, elem_type, other.shape)
    if other.shape is None or len(other.shape) != len(info.shape):
        return TensorInfo(info.name, elem_type, info.shape)
    return TensorInfo(info.name, elem_type, tuple(a if a is not None else b for a, b in zip(info.shape, other.shape)))


def _all_symbols(graph: onnx.GraphProto) -> set[str]:
    return {
        d.dim_param
        for vi in (*graph.input, *graph.output, *graph.value_info)
        for d in vi.type.tensor_type.shape.dim
        if d.HasField("dim_param") and d.dim_param
    }


def _declared_symbols(graph: onnx.GraphProto) -> set[str]:
    """Symbols the model itself names. onnx invents `unk__N` placeholders for anonymous dims
    during inference; those are not in this set and are reported as anonymous."""
    return {
        d.dim_param
        for vi in (*graph.input, *graph.output, *graph.value_info)
        for d in vi.type.tensor_type.shape.dim
        if d.HasField("dim_param") and d.dim_param
    }


def _declared_dims(vi: onnx.ValueInfoProto) -> list[Dim] | None:
    tensor_type = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
        return None
    return [_dim(d) for d in tensor_type.shape.dim]


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    kind = d.WhichOneof("value")  # one call: HasField twice costs twice (24k tensors at 12k nodes)
    if kind == "dim_value":
        # A negative dim_value is malformed; treat it as unknown rather than trust it.
        value = d.dim_value
        return value if value >= 0 else None
    if kind == "dim_param":
        return d.dim_param or None
    return None


def _resolve_bindings(
    graph: onnx.GraphProto, dims: Mapping[str, int], input_shapes: Mapping[str, Sequence[int]],
    keys: Mapping[tuple[str, int], str] = _NO_BINDINGS,
) -> dict[str, int]:
    """Merge `dims` with the symbols `input_shapes` implies, refusing any contradiction: a
    half-consistent binding would size some tensors with one batch and others with another. A
    dim that has only a position key (input_domain.input_dim_keys: no name, a placeholder such
    as Paddle's '?', or -1) binds that key, so two '?' dims may take two sizes."""
    bindings: dict[str, int] = {}
    for name, value in dims.items():
        bindings[name] = _check_dim_value(value, f"dim {name!r}")
    inputs = {vi.name: vi for vi in graph.input}
    for input_name, shape in input_shapes.items():
        if input_name not in inputs:
            known = ", ".join(inputs) or "none"
            raise ValueError(
                f"input_shapes names {input_name!r}, which is not a graph input (inputs: {known})"
            )
        values = [_check_dim_value(v, f"input {input_name!r}") for v in shape]
        declared = _declared_dims(inputs[input_name])
        if declared is None:
            continue
        if len(declared) != len(values):
            raise ValueError(
                f"input {input_name!r} has rank {len(declared)} {_format_shape(declared)}, "
                f"but input_shapes gives rank {len(values)} {_format_shape(values)}"
            )
        for index, (want, got) in enumerate(zip(declared, values)):
            if isinstance(want, int) and want != got:
                raise ValueError(
                    f"input {input_name!r} dim {index} is fixed at {want} in the model, "
                    f"but input_shapes gives {got}"
                )
            key = keys.get((input_name, index), want)
            if isinstance(key, str):
                if bindings.setdefault(key, got) != got:
                    raise ValueError(
                        f"input {input_name!r} dim {index} is {key!r}, bound to "
                        f"{bindings[key]} elsewhere, but input_shapes gives {got}"
                    )
    return bindings


def _check_dim_value(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what}: a dim must be a non-negative integer, got {value!r}")
    return value


def _format_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _with_shape_values(copy: onnx.ModelProto, inferred: onnx.ModelProto,
                       rounds: int = _SHAPE_VALUE_ROUNDS) -> onnx.ModelProto | None:
    """Inference again with the shape arithmetic onnx's data propagation left open computed
    (shape_values.py) and written into `copy` as Constant nodes, until nothing more is learnt;
    None when nothing was."""
    opset = next((o.version for o in copy.opset_import if o.domain in ("", "ai.onnx")), 0)
    values = initial_values(list(copy.graph.initializer))
    improved = None
    for _ in range(rounds):
        by_name = {vi.name: vi for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)}

        def shape_of(name: str) -> tuple[int, ...] | None:
            vi = by_name.get(name)
            dims = _declared_dims(vi) if vi is not None else None
            return tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None

        nodes = list(copy.graph.node)
        if not evaluate_shape_values(nodes, shape_of, opset, values):
            break
        nodes, replaced = as_constant_nodes(nodes, values)
        if not replaced:
            break
        del copy.graph.node[:]
        copy.graph.node.extend(nodes)
        inferred = improved = run_inference(copy)[0]
    return improved


def _collect(
    original: onnx.GraphProto,
    inferred: onnx.GraphProto,
    bindings: Mapping[str, int],
    declared: set[str],
    placeholders: dict[str, tuple[Dim, ...]] | None = None,
) -> dict[str, TensorInfo]:
    """TensorInfo per top-level name, in graph order: inputs, initializers, node outputs, outputs.
    `placeholders`, when given, receives the raw dims of tensors with onnx-made symbols.

    Subgraph-internal tensors are left out on purpose: the memory audit looks at the top level.
    """
    by_name = {vi.name: vi for vi in (*inferred.value_info, *inferred.input, *inferred.output)}
    # Reading a type field by field costs a wrapper per field and per dim (20k tensors: most of
    # an inference's time), serializing it 0.3 us: each distinct type is read once.
    types: dict[bytes, tuple[int | None, tuple[Dim, ...] | None, tuple[Dim, ...] | None]] = {}

    def info(vi: onnx.ValueInfoProto) -> TensorInfo:
        key = vi.type.SerializeToString()
        parsed = types.get(key)
        if parsed is None:
            parsed = types[key] = _parsed_type(vi, bindings, declared)
        elem_type, shape, _ = parsed
        return TensorInfo(vi.name, 0, None) if elem_type is None else TensorInfo(vi.name, elem_type, shape)

    tensors: dict[str, TensorInfo] = {}
    for vi in original.input:
        tensors[vi.name] = info(by_name.get(vi.name, vi))
    for init in original.initializer:
        # The initializer's own dims are the truth, whatever the input declaration says.
        tensors[init.name] = TensorInfo(init.name, init.data_type, tuple(init.dims))
    for node in original.node:
        for name in node.output:
            if name and name not in tensors:
                vi = by_name.get(name)
                tensors[name] = info(vi) if vi else TensorInfo(name, 0, None)
                if placeholders is not None and vi is not None and None in (tensors[name].shape or ()):
                    raw = types[vi.type.SerializeToString()][2]
                    if raw is not None and any(isinstance(d, str) and d not in declared for d in raw):
                        placeholders[name] = tuple(d if isinstance(d, str) and d not in declared else None
                                                   for d in raw)
    for vi in original.output:
        if vi.name not in tensors:
            tensors[vi.name] = info(by_name.get(vi.name, vi))
    return tensors


def _parsed_type(vi: onnx.ValueInfoProto, bindings: Mapping[str, int], declared: set[str]
                 ) -> tuple[int | None, tuple[Dim, ...] | None, tuple[Dim, ...] | None]:
    """_info's element type (None: not a tensor) and shape of `vi`, and its raw dims."""
    if not vi.type.HasField("tensor_type"):
        # Sequences, maps and optionals have no single size.
        return None, None, None
    dims = _declared_dims(vi)
    elem_type = vi.type.tensor_type.elem_type
    if dims is None:
        return elem_type, None, None
    # Substituting after inference too catches symbols inference carried through untouched.
    shape = tuple(
        bindings.get(d, d if d in declared else None) if isinstance(d, str) else d for d in dims
    )
    return elem_type, shape, tuple(dims)


def _unknown_dims(name: str, info: TensorInfo) -> list[UnknownDim]:
    if info.shape is None:
        return [UnknownDim(name, None, None)]
    return [
        UnknownDim(name, index, d if isinstance(d, str) else None)
        for index, d in enumerate(info.shape)
        if not isinstance(d, int)
    ]
