"""A Reshape and the Reshape back around elementwise operators: both go, the operators run on x."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.core.domains import is_default_domain
from fuse_cli.graph.edit import GraphEditor, Replacement, rebuilt
from fuse_cli.match import Match, constant_value, is_missing, producer_of
from fuse_cli.pipeline.base import GraphPass
from fuse_cli.pipeline.registry import register

# Default-domain operators whose output element i depends only on input element i (a constant
# operand of one element broadcasts to any shape of at least its rank): they compute the same
# values whatever shape the elements are viewed in.
ELEMENTWISE_OPS = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitwiseAnd", "BitwiseNot", "BitwiseOr",
    "BitwiseXor", "Cast", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu",
    "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual",
    "Log", "Max", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal", "Relu", "Round",
    "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Tan", "Tanh", "ThresholdedRelu",
    "Where", "Xor",
})
# A region larger than this is not looked at (exporters' activations are a handful of nodes).
MAX_REGION = 32


@register
class ReshapeAroundElementwise(GraphPass):
    """x ── Reshape(s1) ── y ── f ── z ── Reshape(s2) ── out     (f: elementwise, out's shape = x's)
        =>  x ── f ── out

    f is a subgraph of elementwise operators (Add, Mul, Pow, Tanh, Erf, Cast, ...) whose only
    non-constant input is y, whose constants hold one element each and have no more dims than x,
    and whose intermediates are read only inside it. Elementwise operators give element i from
    element i, and a Reshape keeps the element order, so f computes the same elements on x as on
    y; Reshape(s2) then only restores x's shape. That out has x's shape is proved from s2: a
    constant of x's rank whose entries are x's static dims but for at most one -1 (the element
    count, which x and z share, fixes that one); no 0, so allowzero does not matter. torch's dynamo
    export of GPT-2 wraps its GELU so
    ([B*S, 4D] -> [B, S, 4D] -> GELU -> [B*S, 4D] -> Gemm). The first Reshape stays when others
    read y.
    """

    name = "reshape-around-elementwise"
    description = "Remove a Reshape and the Reshape back to the same shape around elementwise operators"
    label = "Reshape + elementwise + Reshape back"

    def run(self, g: GraphEditor) -> list[tuple[list[str], list[str], list[str]]]:
        changes = []
        nodes = list(g.graph.nodes)  # as they stand until the commit below
        order = {id(n): i for i, n in enumerate(nodes)}
        for node in reversed(nodes):
            if node.op != "Reshape" or not is_default_domain(node.domain) or g.is_removed(node):
                continue
            found = _region(node, g, order)
            if found is None:
                continue
            first, region = found
            m = Match(root=node, covered=[node, *region])
            if g.replace_reason(m) or g.reroute_reason(node.outputs[0], region[-1].outputs[0]):
                continue
            # the region's values live on under fresh names: only the second view is gone (the first
            # too when nothing else read it, below)
            gone = [node.outputs[0].name]
            replacement = _on_input(first, region, node, g)
            g.apply(m, replacement)
            changes.append(([n.name for n in m.covered], [n.name for n in replacement.nodes], gone))
        if changes:
            dropped = g.commit()
            if dropped:  # the first Reshape, when nothing else read y
                replaced, created, removed = changes[-1]
                changes[-1] = ([*replaced, *(name for name, _ in dropped)], created,
                               [*removed, *(t for _, outs in dropped for t in outs)])
        return changes


def _region(last: gs.Node, g: GraphEditor, order: dict[int, int]) -> tuple[gs.Node, list[gs.Node]] | None:
    """The Reshape that feeds the elementwise subgraph ending in `last`'s data input, and the
    subgraph's nodes in graph order (`order`: each node's position; its output's producer last);
    None when it is not one."""
    if len(last.inputs) != 2:
        return None
    shape = constant_value(last.inputs[1])
    top = producer_of(last.inputs[0])
    if shape is None or shape.ndim != 1 or top is None or top.op not in ELEMENTWISE_OPS:
        return None
    region: dict[int, gs.Node] = {}
    constants: list[np.ndarray] = []
    first: gs.Node | None = None
    stack = [top]
    while stack:
        node = stack.pop()
        if id(node) in region:
            continue
        if (node.op not in ELEMENTWISE_OPS or not is_default_domain(node.domain) or len(node.outputs) != 1
                or len(region) >= MAX_REGION):
            return None
        region[id(node)] = node
        for tensor in node.inputs:
            if is_missing(tensor):
                continue  # an omitted optional input (Clip without a min)
            value = constant_value(tensor)
            if value is not None:
                constants.append(value)
                continue
            producer = producer_of(tensor)
            if producer is None:
                return None  # a graph input: a second entry
            if producer.op == "Reshape" and is_default_domain(producer.domain):
                if first is not None and producer is not first:
                    return None  # two entries: f would read two views
                first = producer
            else:
                stack.append(producer)
    if first is None or not _restores(shape, first.inputs[0], constants, g):
        return None
    return first, sorted(region.values(), key=lambda n: order[id(n)])


def _restores(shape: np.ndarray, x: gs.Tensor, constants: list[np.ndarray], g: GraphEditor) -> bool:
    """Does Reshape(z, shape) give x's shape (z has x's element count), and may every constant of
    the region broadcast against x without growing it?"""
    dims = g.shape(x)
    if dims is None or len(shape) != dims.rank:
        return False
    free = [i for i, s in enumerate(shape.tolist()) if s != dims.static(i) or not s]
    if len(free) > 1 or (free and shape[free[0]] != -1):
        return False
    return all(value.size == 1 and value.ndim <= dims.rank for value in constants)


def _on_input(first: gs.Node, region: list[gs.Node], last: gs.Node, g: GraphEditor) -> Replacement:
    """The region's nodes again, reading x where they read y, with fresh outputs (their shapes
    are x's now, not the ones inference recorded under the old names)."""
    x, y = first.inputs[0], first.outputs[0]
    renamed: dict[int, gs.Tensor] = {id(y): x}
    nodes = []
    for node in region:
        output = g.variable(node.outputs[0].name, like=node.outputs[0])
        renamed[id(node.outputs[0])] = output
        nodes.append(rebuilt(node, inputs=[renamed.get(id(t), t) for t in node.inputs], outputs=[output]))
    return Replacement(nodes=nodes, reroute=[(last.outputs[0], nodes[-1].outputs[0])])
