"""Shape arithmetic evaluated where onnx's data propagation gives up, so that tensors downstream of
a computed shape get sizes.

Exporters compute shapes at run time. timm's Swin pads each stage to whole windows by
`(window - H % window) % window`; onnx's data propagation has no rule for Mod (nor for Where,
Range, Max, ...), so the Pad's output has no shape and nor does anything after it: 844 tensors of
swin-tiny at batch 1, the window attention itself, which the memory audit then could not count.
With the input dims bound, those values are small integer arithmetic over known dims: this module
computes them with numpy, and shapes.py runs onnx's inference again with them written as Constant
nodes (the values hold at that binding only, so only bound tables go through here).

Only operators whose result cannot depend on an ambiguity are evaluated, and only values of at
most MAX_ELEMENTS elements (shapes, pads, indices): never activations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

MAX_ELEMENTS = 1024


def initial_values(initializers: list[onnx.TensorProto]) -> dict[str, np.ndarray]:
    """The small initializers' values: where evaluation starts."""
    return _Values(initializers)


class _Values(dict):
    """Values by name: those computed, and the small initializers', each read on first use (a
    12k-node graph holds thousands of small weights no shape arithmetic reads: reading them all
    took longer than the evaluation)."""

    def __init__(self, initializers: list[onnx.TensorProto]):
        super().__init__()
        self._unread = {tensor.name: tensor for tensor in initializers}

    def __missing__(self, name: str) -> np.ndarray:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str, default=None):
        value = dict.get(self, name)
        if value is None and (tensor := self._unread.pop(name, None)) is not None:
            value = _small_array(tensor)
            if value is not None:
                self[name] = value
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        return self.get(name) is not None


def evaluate_shape_values(nodes: list[onnx.NodeProto], shape_of: Callable[[str], tuple[int, ...] | None],
                          opset: int, values: dict[str, np.ndarray]) -> int:
    """Add to `values` every small tensor computable from them and from fully known shapes, for
    `nodes` in topological order; how many were added. `shape_of(name)`: the tensor's shape when
    every dim is known, else None. Called again after inference has learnt more shapes, it only
    tries what it could not compute before."""
    added = 0
    for node in nodes:
        rule = _RULES.get(node.op_type)  # first: most nodes have none, and each field read costs
        if rule is None or node.domain not in ("", "ai.onnx") or not node.output or node.output[0] in values:
            continue
        if node.op_type in ("Shape", "Size"):
            shape = shape_of(node.input[0])
            if shape is None:
                continue
            args: list = [shape]
        else:
            args = _known_args(node.input, values)
            if args is None:
                continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        try:
            results = rule(args, attrs, opset)
        except (ValueError, IndexError, TypeError, ZeroDivisionError, OverflowError, FloatingPointError):
            continue  # an input the operator would refuse too: leave the value unknown
        for name, value in zip(node.output, results):
            if name and value is not None and value.size <= MAX_ELEMENTS:
                values[name] = value
                added += 1
    return added


def evaluates(op_type: str) -> bool:
    """Whether evaluate_shape_values has a rule for this (default-domain) operator."""
    return op_type in _RULES


def _known_args(names, values: Mapping[str, np.ndarray]) -> list | None:
    """Each input's value, or None at the first unknown one (no weight after it is read)."""
    args = []
    for name in names:
        value = values.get(name) if name else _ABSENT
        if value is None:
            return None
        args.append(value)
    return args


def as_constant_nodes(nodes: list[onnx.NodeProto],
                      values: Mapping[str, np.ndarray]) -> tuple[list[onnx.NodeProto], int]:
    """`nodes` with every node whose outputs all have values replaced by Constant nodes writing
    them (same names), and how many were replaced."""
    out: list[onnx.NodeProto] = []
    replaced = 0
    for node in nodes:
        names = [n for n in node.output if n]
        if node.op_type != "Constant" and names and all(n in values for n in names) and node.domain in ("", "ai.onnx"):
            out.extend(helper.make_node("Constant", [], [n], value=numpy_helper.from_array(values[n], n))
                       for n in names)
            replaced += 1
        else:
            out.append(node)
    return out, replaced


_ABSENT = np.zeros(0)  # an omitted optional input


def _small_array(tensor: onnx.TensorProto) -> np.ndarray | None:
    """The tensor's value when it is small and held in the proto (the inference copy leaves big
    payloads out, pointing them at a location that does not exist)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL or int(np.prod(tensor.dims, dtype=np.int64)) > MAX_ELEMENTS:
        return None
    return numpy_helper.to_array(tensor)


def _axes(args, attrs, index: int):
    """`axes` from the input at `index` (newer opsets) or the attribute (older ones)."""
    if len(args) > index and args[index].size:
        return [int(a) for a in args[index].reshape(-1)]
    value = attrs.get("axes")
    return None if value is None else [int(a) for a in value]


def _constant(args, attrs, opset):
    if "value" in attrs:
        return [_small_array(attrs["value"])]
    for key, dtype in (("value_int", np.int64), ("value_float", np.float32)):
        if key in attrs:
            return [np.array(attrs[key], dtype)]
    for key, dtype in (("value_ints", np.int64), ("value_floats", np.float32)):
        if key in attrs:
            return [np.array(list(attrs[key]), dtype)]
    return [None]


def _shape(args, attrs, opset):
    shape = args[0]
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    return [np.array(shape[slice(start, end)], np.int64)]


def _integer_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # onnxruntime's integer Div is C++'s: truncation toward zero, not numpy's floor.
    if np.any(b == 0):
        raise ZeroDivisionError
    quotient = np.abs(a) // np.abs(b)
    return (quotient * np.sign(a) * np.sign(b)).astype(np.result_type(a, b))


def _div(args, attrs, opset):
    a, b = args
    if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        return [_integer_divide(a, b)]
    return [(a / b).astype(np.result_type(a, b))]


def _mod(args, attrs, opset):
    a, b = args
    if np.any(b == 0):
        raise ZeroDivisionError
    if attrs.get("fmod", 0):
        return [np.fmod(a, b)]
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError("floating Mod needs fmod=1")
    return [np.mod(a, b)]  # the divisor's sign, as onnx's integer Mod


def _binary(fn, keeps_dtype: bool = True):
    """An elementwise rule; arithmetic keeps its inputs' dtype, a comparison gives booleans."""
    def rule(args, attrs, opset):
        a, b = args
        if a.dtype != b.dtype:
            raise TypeError("mixed types")
        return [fn(a, b).astype(a.dtype) if keeps_dtype else fn(a, b)]
    return rule


def _variadic(fn):
    def rule(args, attrs, opset):
        result = args[0]
        for other in args[1:]:
            result = fn(result, other)
        return [result.astype(args[0].dtype)]
    return rule


def _unary(fn):
    return lambda args, attrs, opset: [fn(args[0]).astype(args[0].dtype)]


def _cast(args, attrs, opset):
    return [args[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))]


def _gather(args, attrs, opset):
    data, indices = args
    return [np.take(data, indices.astype(np.int64), axis=attrs.get("axis", 0))]


def _concat(args, attrs, opset):
    return [np.concatenate(args, axis=attrs["axis"])]


def _unsqueeze(args, attrs, opset):
    axes = _axes(args, attrs, 1)
    rank = args[0].ndim + len(axes)
    value = args[0]
    for axis in sorted(a + rank if a < 0 else a for a in axes):
        value = np.expand_dims(value, axis)
    return [value]


def _squeeze(args, attrs, opset):
    axes = _axes(args, attrs, 1)
    return [np.squeeze(args[0], axis=None if axes is None else tuple(axes))]


def _reshape(args, attrs, opset):
    data, shape = args
    shape = [int(s) for s in shape]
    if not attrs.get("allowzero", 0):
        shape = [data.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [data.reshape(shape)]


def _slice(args, attrs, opset):
    data = args[0]
    if opset < 10:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts, ends = args[1], args[2]
        axes = args[3] if len(args) > 3 and args[3].size else None
        steps = args[4] if len(args) > 4 and args[4].size else None
    axes = list(range(len(starts))) if axes is None else [int(a) for a in np.reshape(axes, -1)]
    steps = [1] * len(axes) if steps is None else [int(s) for s in np.reshape(steps, -1)]
    index = [slice(None)] * data.ndim
    for axis, start, end, step in zip(axes, np.reshape(starts, -1), np.reshape(ends, -1), steps):
        if step == 0:
            raise ValueError("step 0")
        # numpy clamps out-of-range bounds as onnx does (int64 extremes included).
        index[axis] = slice(int(start), int(end), step)
    return [data[tuple(index)]]


def _transpose(args, attrs, opset):
    perm = attrs.get("perm")
    return [np.transpose(args[0], None if perm is None else list(perm))]


def _split(args, attrs, opset):
    data, axis = args[0], attrs.get("axis", 0)
    sizes = args[1] if len(args) > 1 and args[1].size else attrs.get("split")
    if sizes is None:
        parts = attrs.get("num_outputs")
        if parts is None:
            raise ValueError("Split's output count is the node's, not known here")
        step = -(-data.shape[axis] // parts)  # onnx: all of ceil(n / parts), the last one smaller
        sizes = [min(step, data.shape[axis] - k * step) for k in range(parts)]
    bounds = np.cumsum([int(x) for x in np.reshape(sizes, -1)])[:-1]
    return list(np.split(data, bounds, axis=axis))


def _range(args, attrs, opset):
    start, limit, delta = (a.reshape(()) for a in args)
    if delta == 0:
        raise ValueError("delta 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    if count > MAX_ELEMENTS:
        raise OverflowError
    return [(start + delta * np.arange(count)).astype(start.dtype)]


def _where(args, attrs, opset):
    condition, a, b = args
    return [np.where(condition, a, b).astype(a.dtype)]


def _constant_of_shape(args, attrs, opset):
    shape = [int(s) for s in args[0]]
    if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
        raise OverflowError
    fill = _small_array(attrs["value"]).reshape(-1)[0] if "value" in attrs else np.float32(0)
    return [np.full(shape, fill, dtype=np.asarray(fill).dtype)]


def _expand(args, attrs, opset):
    data, shape = args
    target = np.broadcast_shapes(data.shape, tuple(int(s) for s in shape))
    if int(np.prod(target, dtype=np.int64)) > MAX_ELEMENTS:
        raise OverflowError
    return [np.broadcast_to(data, target).copy()]


def _reduce(fn):
    def rule(args, attrs, opset):
        axes = _axes(args, attrs, 1)
        if axes is None and attrs.get("noop_with_empty_axes", 0):
            return [args[0]]
        keep = bool(attrs.get("keepdims", 1))
        return [np.asarray(fn(args[0], axis=None if axes is None else tuple(axes),
                              keepdims=keep)).astype(args[0].dtype)]
    return rule


_RULES: dict[str, Callable] = {
    "Constant": _constant,
    "Shape": _shape,
    "Size": lambda args, attrs, opset: [np.array(int(np.prod(args[0], dtype=np.int64)), np.int64)],
    "Identity": lambda args, attrs, opset: [args[0]],
    "Cast": _cast,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Slice": _slice,
    "Range": _range,
    "Transpose": _transpose,
    "Split": _split,
    "Where": _where,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _div,
    "Mod": _mod,
    "Equal": _binary(np.equal, keeps_dtype=False),
    "Less": _binary(np.less, keeps_dtype=False),
    "Greater": _binary(np.greater, keeps_dtype=False),
    "LessOrEqual": _binary(np.less_equal, keeps_dtype=False),
    "GreaterOrEqual": _binary(np.greater_equal, keeps_dtype=False),
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Neg": _unary(np.negative),
    "Abs": _unary(np.abs),
    "Floor": _unary(np.floor),
    "Ceil": _unary(np.ceil),
    "Not": lambda args, attrs, opset: [np.logical_not(args[0])],
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
}
