"""What random inputs a model accepts, read from the graph itself: sizes for its symbolic dims
and value ranges for its integer inputs.

Sizes. Verification that binds every symbolic dim to the same number cannot tell two symbols
apart: a rewrite that confuses `N` with `M` passes at N = M = 2. So each free symbol gets its own
prime (never 1 or 2, and none of the model's static input dims, so that `batch` is not mistaken for
3 channels either), and verification runs at two such settings with different primes, so that a
size baked into the output by one setting shows at the other. Dims the exporter wrote as
arithmetic of symbols (`past + sequence`, dynamo's `s0 + s1`) are evaluated, never given a value
of their own: they are not free. Symbols the user bound (`--dim`, `--input-shape`: one binding)
keep their value in both. A dim with no usable name (none, Paddle's '?', -1) is its own symbol,
named by its position (`x.dim2`): two '?' dims are two sizes. Where the primes fail on the
original (an FPN at odd sizes, a 512-sample window), sizes derived from the model are tried.

Integer values. An index into an embedding table must be below the table's row count, or
onnxruntime refuses to run the original (BERT's 2-row `token_type_ids` table under random values
0..9). An integer input is followed through value-preserving ops (Cast, Unsqueeze, Reshape, ...)
and Add/Sub of constants to every Gather that uses it as indices; the tightest table bounds it.
Masks take 0/1 (exporters compute (1 - mask) * finfo.min, which overflows for other values);
position ids take [0, sequence).
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from fractions import Fraction
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from fuse_cli.core.domains import is_default_domain
from fuse_cli.core.feeds import MASK_RANGE, position_key
from fuse_cli.errors import UsageError



# ---------------------------------------------------------------------------------------- sizes

def shape_settings(model: onnx.ModelProto, bound: Mapping[str, int] | None = None) -> list[list[dict[str, int]]]:
    """Candidate dims for verification, best first: each candidate is the list of settings to
    run: two in which distinct free symbols have distinct sizes; when the user bound every
    symbol, the bound setting and one at distinct primes (the bound one alone last); one for a
    model without symbols. Keys are the dim_param strings of the graph inputs, as onnxruntime's free-dimension
    overrides and random inputs look them up.

    The later candidates set one free symbol to 1: a model may broadcast one input against
    another ([N, 4] + [M, 4]) and so accept only N == M or a 1 on one side; distinct sizes for
    the others keep them apart."""
    bound = dict(bound or {})
    expressions = {p: _parse(p) for p in _input_dim_params(model)}
    symbols = [name for name in free_symbols(model) if name not in bound]
    if not symbols:
        named = [name for name in bound if any(name == p or (e is not None and name in _names(e))
                                               for p, e in expressions.items())]
        if not named:
            return [[_evaluate_all(expressions, bound)]]
        # every symbol bound (--dim): that setting, and a second at distinct primes, which a model
        # needing exactly the bound sizes may refuse (then the bound setting alone)
        avoid = set(bound.values()) | _static_input_dims(model)
        primes = dict(zip(named, (p for p in _primes() if p not in avoid)))
        return [[_evaluate_all(expressions, bound), _evaluate_all(expressions, {**bound, **primes})],
                [_evaluate_all(expressions, bound)]]
    avoid = set(bound.values()) | _static_input_dims(model)
    primes = (p for p in _primes() if p not in avoid)
    first = dict(zip(symbols, primes))
    second = dict(zip(symbols, primes))
    variants = [{}] + [{name: 1} for name in symbols[:_MAX_ONES]]
    return [[_evaluate_all(expressions, {**bound, **values, **ones}) for values in (first, second)]
            for ones in variants]


def with_computed_dims(model: onnx.ModelProto, values: Mapping[str, int]) -> dict[str, int]:
    """`values` (sizes of free symbols) plus every input dim written as arithmetic of them
    (`past_sequence + sequence`), as shape_settings computes it."""
    return _evaluate_all({p: _parse(p) for p in _input_dim_params(model)}, values)


def is_arithmetic(param: str) -> bool:
    """A dim written as arithmetic of symbols (`past_sequence + sequence`), not a symbol of its own."""
    return _parse(param) is not None


def with_declared_arithmetic(model: onnx.ModelProto, values: Mapping[str, int]) -> dict[str, int]:
    """`values` plus every dim the graph declares anywhere (inputs, outputs, value_info) as
    arithmetic of them: a decode step's present K/V of `past_sequence + sequence`, which no input
    carries when the graph takes no mask of that length."""
    graph = model.graph
    params = {dim.dim_param for value in (*graph.input, *graph.output, *graph.value_info)
              if value.type.HasField("tensor_type") for dim in value.type.tensor_type.shape.dim
              if dim.dim_param and not dim.HasField("dim_value")}
    return _evaluate_all({p: _parse(p) for p in sorted(params)}, values)


def free_symbols(model: onnx.ModelProto) -> list[str]:
    """The names a size must be chosen for: input dim_params, and the names inside arithmetic ones."""
    names: list[str] = []
    for param in _input_dim_params(model):
        expr = _parse(param)
        for name in (_names(expr) if expr is not None else [param]):
            if name not in names:
                names.append(name)
    return names


_MAX_ONES = 3  # candidates with a symbol at 1: each costs a load of the original when the one before fails


def describe_setting(setting: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in setting.items()) or "static shapes"


def _input_dim_params(model: onnx.ModelProto) -> list[str]:
    """The names the graph inputs' free dims are bound by, in order, each once."""
    return list(dict.fromkeys(input_dim_keys(model).values()))


# ------------------------------------------------------------------------------ the binding

# dim_params exporters write for "unknown", not as a name: old Paddle exports declare
# [-1, 3, '?', '?'], whose two '?' are independent sizes, not one symbol.
PLACEHOLDER_PARAMS = frozenset({"?", "-1", "None"})


def is_placeholder(param: str) -> bool:
    return param in PLACEHOLDER_PARAMS


def input_dim_keys(model: onnx.ModelProto) -> dict[tuple[str, int], str]:
    """Per free dim of a graph input, (input, position): the name a binding uses for it, its
    dim_param, or its position key where it has none, a placeholder, or -1."""
    initializers = {t.name for t in model.graph.initializer}
    keys: dict[tuple[str, int], str] = {}
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value >= 0:
                continue
            named = dim.HasField("dim_param") and dim.dim_param and not is_placeholder(dim.dim_param)
            keys[(value.name, index)] = dim.dim_param if named else position_key(value.name, index)
    return keys


def binding(model: onnx.ModelProto, dims: Mapping[str, int],
            input_shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The one binding the estimate, verification and measurement share: `--dim` by name or by
    position key, and what `--input-shape` says, per position (a symbol it gives a size binds
    that symbol everywhere; a dim without a usable name binds its position key). A placeholder
    name bound with `--dim ?=48` binds each of its positions. Contradictions are usage errors."""
    keys = input_dim_keys(model)
    result = dict(dims)
    for (input_name, index), key in keys.items():
        param = _declared_param(model, input_name, index)
        if key != param and param in dims:
            result.setdefault(key, dims[param])
    inputs = {v.name: v for v in model.graph.input if v.type.HasField("tensor_type")}
    for input_name, shape in input_shapes.items():
        if input_name not in inputs:
            raise UsageError(f"--input-shape names {input_name!r}, which is not a graph input "
                             f"(inputs: {', '.join(inputs) or 'none'})")
        tensor_type = inputs[input_name].type.tensor_type
        if not tensor_type.HasField("shape"):
            continue  # no declared rank: the estimate takes the whole shape (analysis/shapes.py)
        declared = tensor_type.shape.dim
        if len(declared) != len(shape):
            raise UsageError(f"--input-shape {input_name}: the model declares rank {len(declared)}, "
                             f"the option gives rank {len(shape)}")
        for index, (dim, value) in enumerate(zip(declared, shape)):
            key = keys.get((input_name, index))
            if key is None:
                if dim.dim_value != value:
                    raise UsageError(f"--input-shape {input_name}: dim {index} is fixed at {dim.dim_value} "
                                     f"in the model, the option gives {value}")
            elif result.setdefault(key, int(value)) != value:
                raise UsageError(f"--input-shape {input_name}: dim {index} is {key!r}, bound to "
                                 f"{result[key]} elsewhere, the option gives {value}")
    return result


def input_shapes_at(model: onnx.ModelProto, dims: Mapping[str, int]) -> dict[str, list[int | None]]:
    """Each graph input's shape at `dims` (a binding or a setting): static dims as declared,
    free ones by their key (input_dim_keys), None where `dims` leaves one open."""
    keys = input_dim_keys(model)
    initializers = {t.name for t in model.graph.initializer}
    shapes: dict[str, list[int | None]] = {}
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        shapes[value.name] = [dims.get(keys[(value.name, i)]) if (value.name, i) in keys else d.dim_value
                              for i, d in enumerate(value.type.tensor_type.shape.dim)]
    return shapes


def _declared_param(model: onnx.ModelProto, input_name: str, index: int) -> str:
    value = next(v for v in model.graph.input if v.name == input_name)
    return value.type.tensor_type.shape.dim[index].dim_param


def _static_input_dims(model: onnx.ModelProto) -> set[int]:
    return {d.dim_value for v in model.graph.input if v.type.HasField("tensor_type")
            for d in v.type.tensor_type.shape.dim if d.HasField("dim_value")}


def _primes() -> Iterator[int]:
    for n in itertools.count(3):
        if all(n % p for p in range(2, int(n ** 0.5) + 1)):
            yield n


# A dim_param is arithmetic of symbols when it parses as such: names, integers, + - * / // % and
# Max/Min, floor/ceil (sympy's spellings, which exporters print: torch writes a strided conv's
# output as `floor(floor(height/2 - 1/2)/2) + 1`). Parsed with `ast`, never evaluated as code; `/`
# is exact (fractions), so floor() of it is the integer the runtime computes.
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: Fraction(a) / Fraction(b), ast.FloorDiv: lambda a, b: a // b,
        ast.Mod: lambda a, b: a % b}
_CALLS = {"Max": max, "Min": min, "max": max, "min": min, "floor": math.floor, "ceiling": math.ceil,
          "ceil": math.ceil, "FloorToInt": math.floor, "CeilToInt": math.ceil}


def _parse(param: str) -> ast.expr | None:
    """The expression when `param` is arithmetic of at least one operation, else None (a name)."""
    try:
        expr = ast.parse(param.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if isinstance(expr, ast.Name) or not _allowed(expr):
        return None
    return expr


def _allowed(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return type(node.op) in _OPS and _allowed(node.left) and _allowed(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _allowed(node.operand)
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Name) and node.func.id in _CALLS and not node.keywords
                and all(_allowed(a) for a in node.args))
    return False


def _names(expr: ast.expr) -> list[str]:
    return [n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and n.id not in _CALLS]


def _value(node: ast.expr, values: Mapping[str, int]) -> int:
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp):
        return _OPS[type(node.op)](_value(node.left, values), _value(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand, values)
    return _CALLS[node.func.id](*(_value(a, values) for a in node.args))


def _evaluate_all(expressions: Mapping[str, ast.expr | None], values: Mapping[str, int]) -> dict[str, int]:
    setting = dict(values)
    for param, expr in expressions.items():
        if expr is not None and all(name in values for name in _names(expr)):
            try:
                value = _value(expr, values)
            except ZeroDivisionError:
                continue
            if value == int(value):  # a fraction left over is no size: the expression is not one
                setting[param] = max(1, int(value))
    return setting


# ------------------------------------------------------------------ settings the model accepts

# Sizes models are commonly made for: spatial ones (all multiples of 32, a detector's total
# stride) and sample counts (a 512-sample window, 16 kHz audio).
COMMON_SPATIAL = (224, 256, 320, 512, 640)
COMMON_SAMPLES = (512, 1024, 16000)
_POOLING = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})


def derived_settings(model: onnx.ModelProto, bound: Mapping[str, int] | None = None
                     ) -> list[tuple[dict[str, int], str]]:
    """Single settings to try, best first, where the distinct primes fail on the original (an FPN's
    Concat cannot merge the upsampled map with its skip at odd sizes; a Reshape to [-1, 512] needs
    a multiple of 512; a Conv1d's 400-sample kernel a signal that long), each with where its sizes
    come from. An extent dim (an image's height and width, a signal's samples: the trailing free
    dims) takes sizes from the model: multiples of its total stride (the product of Conv and Pool
    strides along its deepest path), sizes it declares (a Reshape's window, numbers in its
    metadata), the user's bound sizes, then common sizes; the other free dims (batch) distinct
    primes. Each setting gives distinct extent symbols distinct sizes; after them, one size for
    every extent at once (a model that needs height == width); the other dims at 1; last, one size
    for every free dim (unnamed dims the graph equates)."""
    bound = dict(bound or {})
    keys = input_dim_keys(model)
    free = [key for key in free_symbols(model) if key not in bound]
    if not free:
        return []
    extents = [key for key in free if any(key == k and _is_extent(index, _rank(model, name))
                                          for (name, index), k in keys.items())]
    samples = all(_rank(model, name) <= 3 for (name, _), k in keys.items() if k in extents)
    others = [key for key in free if key not in extents]
    strides = _strides(model)
    stride = max([*strides.values(), *_metadata_numbers(model, stride=True)], default=1)
    declared = _declared_sizes(model, strides)
    sources = []
    if stride > 1:
        sources.append((f"multiples of its total stride {stride}", [stride * p for p in _SMALL_PRIMES]))
    if declared:
        sources.append(("sizes it declares (" + ", ".join(map(str, declared)) + ")",
                        [size * k for k in (1, 2, 3) for size in declared]))
    if bound:
        sources.append(("the sizes bound with --dim", sorted(set(bound.values()))))
    sources.append(("common input sizes", list(COMMON_SAMPLES if samples else COMMON_SPATIAL)))
    avoid = set(bound.values()) | _static_input_dims(model)
    primes = [p for p, _ in zip((p for p in _primes() if p not in avoid), range(2 * len(others)))]
    candidates: list[tuple[dict[str, int], str]] = []
    for origin, sizes in sources:
        width = len(extents) or 1
        distinct = [sizes[i:i + len(extents)] for i in range(0, len(sizes) - len(extents) + 1, width)][:2]
        square = [[size] * len(extents) for size in sizes[:1]] if len(extents) > 1 else []
        for index, group in enumerate(distinct + square):
            batch = dict(zip(others, primes[(index % 2) * len(others):]))
            candidates.append(({**bound, **batch, **dict(zip(extents, group))}, f"derived from the model: {origin}"))
    # then the other dims at 1 (a model that takes one image at a time)
    candidates += [({**setting, **dict.fromkeys(others, 1)}, origin) for setting, origin in candidates[::3]
                   if others]
    # last, one size for every free dim: dims with neither a name nor a value that the graph
    # equates (silero's input [?, ?] and state [2, ?, 128] share a batch) take the same size
    # only this way; a slot is kept for them, since they are the only ones such a model runs
    uniform = [({**bound, **dict.fromkeys(free, sizes[0])}, f"derived from the model: {origin}, one size for every dim")
               for origin, sizes in sources if len(free) > 1][:_UNIFORM_SLOTS]
    settings: list[tuple[dict[str, int], str]] = []
    for setting, origin in [*candidates[:_MAX_DERIVED - len(uniform)], *uniform,
                            *candidates[_MAX_DERIVED - len(uniform):]]:
        setting = with_computed_dims(model, setting)
        if all(setting != known for known, _ in settings):
            settings.append((setting, origin))
    return settings[:_MAX_DERIVED]


_MAX_DERIVED = 12  # each candidate tried costs one run of the original
_UNIFORM_SLOTS = 2
_SMALL_PRIMES = (3, 5, 7, 11, 13, 17)


def _is_extent(index: int, rank: int) -> bool:
    """A trailing dim: a [samples] signal's only one, [batch, samples] its second, an image's last two."""
    return index >= min(max(1, rank - 2), rank - 1)


def _rank(model: onnx.ModelProto, input_name: str) -> int:
    value = next(v for v in model.graph.input if v.name == input_name)
    return len(value.type.tensor_type.shape.dim)


def _strides(model: onnx.ModelProto) -> dict[str, int]:
    """Per tensor, the product of Conv and Pool strides on the deepest path to it from the inputs
    (nodes as stored, which exporters write in order): the largest is the factor an FPN's or a
    detector's input must be a multiple of."""
    reached: dict[str, int] = {}
    if not any(node.op_type in _POOLING for node in model.graph.node):
        return reached  # every tensor at stride 1: no walk (a 12k-node transformer: 0.1 s)
    for node in model.graph.node:
        here = max((reached.get(name, 1) for name in node.input if name), default=1)
        if node.op_type in _POOLING and is_default_domain(node.domain):
            strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [1])
            here *= max(strides or [1])
        for name in node.output:
            reached[name] = here
    return reached


def _declared_sizes(model: onnx.ModelProto, strides: Mapping[str, int]) -> list[int]:
    """Input sizes the model itself states: the window of a Reshape to [-1, 512] (the product of
    its other entries), a feature map's declared size times its stride (value_info an exporter
    wrote at its export size), and numbers in its metadata (ultralytics writes imgsz [640, 640])."""
    tensors = _constant_tensors(model.graph)
    sizes: list[int] = []
    for node in model.graph.node:
        if node.op_type == "Reshape" and is_default_domain(node.domain) and len(node.input) > 1:
            shape = tensors.get(node.input[1])
            if shape is not None and shape.data_location != onnx.TensorProto.EXTERNAL and len(shape.dims) == 1:
                values = numpy_helper.to_array(shape).tolist()
                if -1 in values and all(v > 0 for v in values if v != -1):
                    sizes.append(int(np.prod([v for v in values if v != -1])))
    for value in (*model.graph.value_info, *model.graph.output):
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else ()
        if len(dims) >= 3 and dims[-1].HasField("dim_value") and strides.get(value.name, 1) > 1:
            sizes.append(dims[-1].dim_value * strides[value.name])
    sizes += _metadata_numbers(model, stride=False)
    return [size for size in dict.fromkeys(sizes) if size > 1][:4]


# metadata keys that state an input size (ultralytics: imgsz [640, 640]) or a stride (stride 32);
# other keys hold numbers that are no size (a date, a version, class indices)
_SIZE_KEY = re.compile(r"imgsz|size|shape|resolution|height|width|sample|window", re.IGNORECASE)


def _metadata_numbers(model: onnx.ModelProto, *, stride: bool) -> list[int]:
    return [int(n) for prop in model.metadata_props
            if ("stride" in prop.key.lower()) == stride and (stride or _SIZE_KEY.search(prop.key))
            for n in re.findall(r"\b\d+\b", prop.value) if 1 < int(n) <= 65536]


# ------------------------------------------------------------------------------ branch values

def branch_inputs(model: onnx.ModelProto) -> list[str]:
    """Bool graph inputs an If's condition is computed from (optimum's merged decoders take
    `use_cache_branch`): verification feeds each of them true at one setting and false at the
    other, so that every branch runs."""
    flags = [value.name for value in model.graph.input if value.type.tensor_type.elem_type == onnx.TensorProto.BOOL]
    if not flags:
        return []
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in set(node.input):
            consumers.setdefault(name, []).append(node)
    chosen = []
    for flag in flags:
        todo, seen = [flag], set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in consumers.get(name, ()):
                if node.op_type == "If" and node.input[0] == name:
                    chosen.append(flag)
                    todo = []
                    break
                todo.extend(node.output)
    return list(dict.fromkeys(chosen))


# ------------------------------------------------------------------------------ integer values

# Ops whose output holds the input's values (some of them, rearranged), so an index stays an index.
_VALUE_PRESERVING = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand",
                               "Transpose", "Slice", "Gather", "Concat", "Tile"})


def integer_ranges(model: onnx.ModelProto) -> dict[str, tuple[int, int] | None]:
    """Per integer graph input: its valid [low, high) range where the graph says it (Gather
    indices, masks), None for position ids (their range is the input's own last dim)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            consumers.setdefault(name, []).append(node)
    tensors = _constant_tensors(graph)
    # the offsets Add/Sub may apply: scalars, decoded; the tables Gather reads: their dims only
    constants = {name: numpy_helper.to_array(t) for name, t in tensors.items()
                 if int(np.prod(t.dims)) == 1 and t.data_location != onnx.TensorProto.EXTERNAL}
    tables = {name: list(t.dims) for name, t in tensors.items()}
    ranges: dict[str, tuple[int, int] | None] = {}
    selecting = branch_selecting_values(model)
    for value in graph.input:
        if value.name in initializers or not _is_integer(value):
            continue
        bound = _gather_bound(value.name, consumers, constants, tables)
        lowered = value.name.lower()
        if value.name in selecting:  # the value an If's condition names: the branch the model is for
            ranges[value.name] = (selecting[value.name], selecting[value.name] + 1)
        elif bound is not None:
            ranges[value.name] = bound
        elif "mask" in lowered:
            ranges[value.name] = MASK_RANGE
        elif "position" in lowered:
            ranges[value.name] = None
    return ranges


def _is_integer(value: onnx.ValueInfoProto) -> bool:
    if not value.type.HasField("tensor_type"):
        return False
    elem = value.type.tensor_type.elem_type
    if elem in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.BOOL, onnx.TensorProto.STRING):
        return False
    return np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(elem), np.integer)


def _constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Initializers and Constant nodes' values, as TensorProtos (nothing is decoded here)."""
    tensors = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and is_default_domain(node.domain):
            for attr in node.attribute:
                if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                    tensors[node.output[0]] = attr.t
    return tensors


def _gather_bound(start: str, consumers, constants, tables) -> tuple[int, int] | None:
    """The tightest [low, high) over every Gather reached from `start` as its indices, through
    value-preserving ops and Add/Sub of a constant scalar (which shift the valid range)."""
    low, high = 0, None
    todo, seen = [(start, 0)], set()
    while todo:
        name, offset = todo.pop()
        if (name, offset) in seen:
            continue
        seen.add((name, offset))
        for node in consumers.get(name, ()):
            if not is_default_domain(node.domain):
                continue
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
                rows = _rows(node, tables)
                if rows is not None:
                    # value + offset in [0, rows)  <=>  value in [-offset, rows - offset)
                    low, high = max(low, -offset), rows - offset if high is None else min(high, rows - offset)
                continue
            if node.op_type in _VALUE_PRESERVING and name in (node.input if node.op_type == "Concat"
                                                              else node.input[:1]):
                todo.append((node.output[0], offset))
            elif node.op_type in ("Add", "Sub") and len(node.input) == 2:
                if node.op_type == "Sub" and node.input[1] == name:
                    continue  # c - x: the range flips; not an index pattern
                shift = constants.get(node.input[1] if node.input[0] == name else node.input[0])
                if shift is not None and shift.size == 1 and np.issubdtype(shift.dtype, np.integer):
                    step = int(shift.reshape(-1)[0])
                    todo.append((node.output[0], offset + (step if node.op_type == "Add" else -step)))
    if high is None or high <= low:
        return None
    return low, high


def _rows(node: onnx.NodeProto, tables: Mapping[str, list[int]]) -> int | None:
    dims = tables.get(node.input[0])
    if not dims:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    axis += len(dims) if axis < 0 else 0
    return dims[axis] if 0 <= axis < len(dims) and dims[axis] > 0 else None


_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                            onnx.TensorProto.INT8, onnx.TensorProto.UINT8})


def branch_selecting_values(model: onnx.ModelProto) -> dict[str, int]:
    """Integer inputs that an If's condition compares with a constant (silero-vad's
    If(Equal(sr, 16000))), each with that constant: the branch the model names by a value. Fed at
    random (0..9), such an input takes the other branch, which may not run at the shapes measured
    (silero-vad's 8 kHz branch at a 16 kHz window: onnxruntime fails, the measurement with it)."""
    graph = model.graph
    integers = {vi.name for vi in graph.input if vi.type.tensor_type.elem_type in _INTEGER_TYPES}
    producer = {name: node for node in graph.node for name in node.output}
    constants = {t.name: t for t in graph.initializer}
    constants.update((node.output[0], next((a.t for a in node.attribute if a.name == "value"), None))
                     for node in graph.node if node.op_type == "Constant" and node.output)
    values: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "If" or not node.input:
            continue
        condition = producer.get(node.input[0])
        while condition is not None and condition.op_type in ("Not", "Cast", "Identity"):
            condition = producer.get(condition.input[0])
        if condition is None or condition.op_type != "Equal" or len(condition.input) != 2:
            continue
        first, second = condition.input
        for name, other in ((first, second), (second, first)):
            constant = constants.get(other)
            if name in integers and constant is not None and math.prod(constant.dims) == 1:
                values[name] = int(numpy_helper.to_array(constant).reshape(-1)[0])
    return values


_INTEGER_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16,
                            onnx.TensorProto.INT8, onnx.TensorProto.UINT8})
