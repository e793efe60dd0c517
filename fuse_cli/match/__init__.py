"""A small declarative subgraph matcher over onnx-graphsurgeon graphs.

A pattern reads like the expression it matches, written from the output backwards:

    conv = Op(("Conv", "ConvTranspose"), Var("x"), Var("w", const=True), Var("b", optional=True), name="conv")
    PATTERN = Op("BatchNormalization", conv, Var("scale", const=True), ..., name="bn")

Each element matches a tensor: `Var` any tensor (the same name twice must be the same tensor),
`Op` a tensor produced by a node of that type (keyword arguments beyond name/domain/output
constrain its attributes: `Op("Transpose", x, perm=[0, 2, 1, 3])` wants that value,
`Op("Gemm", a, b, transA=lambda v: not v)` a predicate over the value, None when absent),
`Alt` any of several patterns, `Const` a constant whose value satisfies a predicate. Binary Add/Mul
are tried in both input orders. Matching
yields every way the pattern fits, so alternatives backtrack naturally; structural failure is
silent (not the pattern), while preconditions that fail after a structural match are near-misses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Union

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.graph.values import constant_value, is_missing, producer_of  # noqa: F401 (the matcher's vocabulary)

COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Equal", "And", "Or", "Xor"})

Pattern = Union["Op", "Var", "Alt", "Const"]


@dataclass(frozen=True)
class Var:
    """Any tensor. `const=True` asks the engine to require a constant (with a near-miss if not);
    `optional=True` also matches a missing trailing input (bound to None)."""

    name: str
    const: bool = False
    optional: bool = False


@dataclass(frozen=True)
class Const:
    """A constant tensor whose value satisfies `test` (e.g. "is 0.5"); optionally captured."""

    test: Callable[[np.ndarray], bool]
    name: str | None = None


def any_value(value: np.ndarray) -> bool:
    """Const(any_value): the slot must hold a constant, of any value (a computed operand there
    is another pattern: a residual Add, not a bias)."""
    return True


@dataclass(frozen=True)
class Op:
    """A tensor produced (as output `output`) by a node of `op_type` whose inputs match `inputs`."""

    op_type: str | tuple[str, ...]
    inputs: tuple[Pattern, ...]
    name: str | None = None
    domain: str = ""
    output: int = 0
    attrs: tuple[tuple[str, object], ...] = ()  # (attribute, wanted value or predicate)

    def __init__(self, op_type, *inputs: Pattern, name: str | None = None, domain: str = "", output: int = 0,
                 **attrs: object):
        object.__setattr__(self, "op_type", op_type)
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "domain", domain)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "attrs", tuple(attrs.items()))
        # What every visit checks first, computed once (not fields: equality stays the pattern's).
        # A sweep of a 12k-node graph asks them a third of a million times.
        object.__setattr__(self, "_op_set", frozenset(self.op_types))
        object.__setattr__(self, "_domain", _domain(domain))
        optional = sum(1 for p in self.inputs if _is_optional(p))
        object.__setattr__(self, "_arity", (len(self.inputs) - optional, len(self.inputs)))

    @property
    def op_types(self) -> tuple[str, ...]:
        return (self.op_type,) if isinstance(self.op_type, str) else tuple(self.op_type)


# Variadic operators (Concat, Sum, ...): the matcher's Op has a fixed arity, so a node with any
# number of inputs up to this many is matched as one whose inputs are all optional.
MAX_VARIADIC_INPUTS = 64


def variadic(op_type: str, name: str, count: int = MAX_VARIADIC_INPUTS) -> Op:
    """An `op_type` node named `name` with 1 to `count` inputs, captured as in0, in1, ..."""
    return Op(op_type, *(Var(f"in{i}", optional=True) for i in range(count)), name=name)


@dataclass(frozen=True)
class Alt:
    """The first of several alternative patterns that fits (all are tried on backtracking)."""

    options: tuple[Pattern, ...]

    def __init__(self, *options: Pattern):
        object.__setattr__(self, "options", tuple(options))


@dataclass
class Match:
    """One way a pattern fits: captured nodes and tensors, and every node it covers (root first)."""

    root: gs.Node
    nodes: dict[str, gs.Node] = field(default_factory=dict)
    tensors: dict[str, gs.Tensor | None] = field(default_factory=dict)
    covered: list[gs.Node] = field(default_factory=list)
    const_vars: list[tuple[str, gs.Node]] = field(default_factory=list)

    def node(self, name: str) -> gs.Node:
        return self.nodes[name]

    def tensor(self, name: str) -> gs.Tensor | None:
        return self.tensors.get(name)

    def copy(self) -> Match:
        return Match(self.root, dict(self.nodes), dict(self.tensors), list(self.covered), list(self.const_vars))


def root_op_types(pattern: Op | Alt) -> frozenset[str]:
    """The op types a pattern's root node may have (an Alt at the root allows several)."""
    if isinstance(pattern, Alt):
        return frozenset().union(*(root_op_types(option) for option in pattern.options))
    if isinstance(pattern, Op):
        return pattern._op_set
    raise TypeError(f"a pattern's root must be an Op or an Alt of Ops, not {pattern!r}")


def match_root(pattern: Op | Alt, node: gs.Node) -> Iterator[Match]:
    """Every way `pattern` fits with `node` as its root (the node producing the pattern's value).
    An Alt at the root is tried option by option, in order: put the largest form first."""
    if isinstance(pattern, Alt):
        for option in pattern.options:
            yield from match_root(option, node)
        return
    if not _may_fit(pattern, node):
        return
    for m in _match_node(pattern, node, Match(root=node)):
        if pattern.name:
            m.tensors.setdefault(pattern.name, node.outputs[pattern.output]
                                 if len(node.outputs) > pattern.output else None)
        yield m


def _fitting_inputs(pattern: Op, node: gs.Node) -> list[gs.Tensor] | None:
    """`node`'s inputs, trailing omitted ones dropped, when its type, domain and attributes are
    the pattern's and their number fits the pattern's inputs (the optional ones may be absent);
    else None."""
    if node.op not in pattern._op_set or _domain(node.domain) != pattern._domain:
        return None
    if pattern.attrs and not _attributes_fit(pattern, node):
        return None
    inputs = node.inputs
    count = len(inputs)
    while count and is_missing(inputs[count - 1]):
        count -= 1
    required, most = pattern._arity
    return list(inputs[:count]) if required <= count <= most else None


def _match_node(pattern: Op, node: gs.Node, m: Match) -> Iterator[Match]:
    if any(node is seen for seen in m.covered):
        return
    inputs = _fitting_inputs(pattern, node)
    if inputs is None:
        return
    m = m.copy()
    m.covered.append(node)
    if pattern.name:
        m.nodes[pattern.name] = node
    orders = [inputs]
    if node.op in COMMUTATIVE_OPS and len(inputs) == 2:
        orders.append(inputs[::-1])
    for ordered in orders:
        padded = ordered + [None] * (len(pattern.inputs) - len(ordered))
        yield from _match_inputs(pattern.inputs, padded, node, m)


def _may_fit(pattern: Op, node: gs.Node) -> bool:
    """A necessary condition for `pattern` to fit at `node`, checked without building matches:
    every Op's type, domain, attributes and arity, and that a Const meets a constant. Names are
    not bound and constants not read, so it can pass where matching fails, never the reverse.
    Most nodes a sweep visits are not the pattern, and the generators that do the real matching
    cost several times this check to find that out (on a 12k-node stack: most of a sweep)."""
    inputs = _fitting_inputs(pattern, node)
    if inputs is None:
        return False
    patterns = pattern.inputs
    if node.op in COMMUTATIVE_OPS and len(inputs) == 2:
        first, second = inputs
        return ((_tensor_may_fit(patterns[0], first) and _tensor_may_fit(patterns[1], second))
                or (_tensor_may_fit(patterns[0], second) and _tensor_may_fit(patterns[1], first)))
    count = len(inputs)
    for i, p in enumerate(patterns):  # a loop, not all(generator): this runs a third of a million times
        if not _tensor_may_fit(p, inputs[i] if i < count else None):
            return False
    return True


def _tensor_may_fit(pattern: Pattern, tensor: gs.Tensor | None) -> bool:
    if isinstance(pattern, Var):
        return pattern.optional or not is_missing(tensor)
    if isinstance(pattern, Alt):
        return any(_tensor_may_fit(option, tensor) for option in pattern.options)
    if is_missing(tensor):
        return False
    producers = tensor.inputs
    if isinstance(pattern, Const):
        return isinstance(tensor, gs.Constant) or (len(producers) == 1 and producers[0].op == "Constant")
    if len(producers) != 1:
        return False
    outputs = producers[0].outputs
    return len(outputs) > pattern.output and outputs[pattern.output] is tensor and _may_fit(pattern, producers[0])


def _match_inputs(patterns, tensors, node: gs.Node, m: Match) -> Iterator[Match]:
    if not patterns:
        yield m
        return
    for partial in _match_tensor(patterns[0], tensors[0], node, m):
        yield from _match_inputs(patterns[1:], tensors[1:], node, partial)


def _match_tensor(pattern: Pattern, tensor: gs.Tensor | None, consumer: gs.Node, m: Match) -> Iterator[Match]:
    if isinstance(pattern, Var):
        if tensor is None or is_missing(tensor):
            if pattern.optional:
                m = m.copy()
                m.tensors[pattern.name] = None
                yield m
            return
        bound = m.tensors.get(pattern.name, tensor)
        if bound is not tensor:
            return
        m = m.copy()
        m.tensors[pattern.name] = tensor
        if pattern.const:
            m.const_vars.append((pattern.name, consumer))
        yield m
    elif isinstance(pattern, Const):
        value = constant_value(tensor)
        if value is not None and pattern.test(value) and _may_bind(m, pattern.name, tensor):
            m = m.copy()
            if pattern.name:
                m.tensors[pattern.name] = tensor
            yield m
    elif isinstance(pattern, Alt):
        for option in pattern.options:
            yield from _match_tensor(option, tensor, consumer, m)
    elif isinstance(pattern, Op):
        if tensor is None or is_missing(tensor) or not _may_bind(m, pattern.name, tensor):
            return
        producer = producer_of(tensor)
        if (producer is None or len(producer.outputs) <= pattern.output
                or producer.outputs[pattern.output] is not tensor):
            return
        for matched in _match_node(pattern, producer, m):
            if pattern.name:
                # A named Op also names its output: a Var of that name elsewhere in the pattern
                # must be this very tensor (LayerNorm squares the Sub's output, not any tensor).
                matched.tensors[pattern.name] = tensor
            yield matched
    else:  # pragma: no cover - a programming error in a pattern
        raise TypeError(f"not a pattern element: {pattern!r}")


def _attributes_fit(pattern: Op, node: gs.Node) -> bool:
    """Each constrained attribute has the wanted value (lists compare as lists, whatever their
    container) or satisfies the predicate (given None when the node does not set it)."""
    for key, wanted in pattern.attrs:
        value = node.attrs.get(key)
        if callable(wanted):
            if not wanted(value):
                return False
        elif _plain(value) != _plain(wanted):
            return False
    return True


def _plain(value: object) -> object:
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_plain(v) for v in value)
    return value.decode() if isinstance(value, bytes) else value


def _domain(domain: str | None) -> str:
    """"" and "ai.onnx" both name the default domain (graphsurgeon keeps whichever was written)."""
    return "" if domain in (None, "", "ai.onnx") else domain


def _may_bind(m: Match, name: str | None, tensor: gs.Tensor) -> bool:
    """A name already bound (by a Var, Const or named Op) must be bound to the same tensor."""
    return name is None or m.tensors.get(name, tensor) is tensor


def _is_optional(pattern: Pattern) -> bool:
    return isinstance(pattern, Var) and pattern.optional


def scalar_close(expected: float, rtol: float = 1e-6) -> Callable[[np.ndarray], bool]:
    """A Const test: a single value (any shape with one element) equal to `expected`, to `rtol` or
    to its own dtype's precision where that is coarser (a float16 export stores sqrt(2) as
    1.4140625, 1.1e-4 from it: the same constant, as near as float16 can hold it)."""

    def test(value: np.ndarray) -> bool:
        precision = np.finfo(value.dtype).eps if np.issubdtype(value.dtype, np.floating) else 0.0
        return value.size == 1 and bool(np.isclose(float(value.reshape(-1)[0]), expected,
                                                   rtol=max(rtol, float(precision)), atol=0))

    return test


def bindings_summary(m: Match) -> Mapping[str, str]:
    """Names of what a match captured, for debugging and explanations."""
    return {k: (v.name if v is not None else "<none>") for k, v in {**m.nodes, **m.tensors}.items()}
