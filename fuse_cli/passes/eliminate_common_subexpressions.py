"""Common-subexpression elimination: two nodes computing the same thing become one."""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from fuse_cli.core.domains import is_default_domain
from fuse_cli.graph.edit import GraphEditor, Replacement
from fuse_cli.match import Match, constant_value
from fuse_cli.pipeline.base import GraphPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.constness import VALUE_KEY_BYTES

# Their outputs differ from run to run (or node to node): two of them are two different values.
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})
# A QDQ node unit (DequantizeLinear -> op -> QuantizeLinear) is its consumer's own: a quantizer
# gives every consumer its own pair, and onnxruntime forms a QLinear kernel from a unit only
# where the pair is not shared (merged, a QDQ BERT got 2 QLinearAdd from onnxruntime instead of 12).
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@register
class EliminateCommonSubexpressions(GraphPass):
    """Two nodes of the same operator, attributes and inputs compute the same outputs:

        x ── Shape ── Gather(0) ── a            x ── Shape ── Gather(0) ── a
        x ── Shape ── Gather(0) ── b     =>                              └── (readers of b read a)

    Inputs are the same when they are the same tensor, or small constants (up to 4 KiB) of equal
    dtype, shape and value. Exact: every default-domain ONNX operator is a pure function of its
    inputs and attributes, except the random ones (and Dropout), which are never merged; nor are
    QuantizeLinear / DequantizeLinear, each of which belongs to its consumer's QDQ node unit. Nodes
    with subgraphs (If, Loop, Scan) and operators of other domains are left alone. A duplicate
    whose output is a graph output keeps its node unless the kept output can take its name.
    Walked in topological order, so whole duplicated chains collapse in one sweep.
    """

    name = "eliminate-common-subexpressions"
    description = "Merge nodes that compute the same operator on the same inputs"
    label = "Common subexpression"

    def run(self, g: GraphEditor) -> list[tuple[list[str], list[str], list[str]]]:
        first: dict[tuple, gs.Node] = {}
        changes = []
        inputs: dict[int, tuple] = {}  # each input's key, once: exporters share scalar constants widely
        for node in list(g.graph.nodes):
            key = _key(node, inputs)
            if key is None:
                continue
            kept = first.setdefault(key, node)
            if kept is node or len(kept.outputs) != len(node.outputs):
                continue
            pairs = list(zip(node.outputs, kept.outputs))
            if any(g.reroute_reason(old, new) for old, new in pairs):
                continue
            removed = g.apply(Match(root=node, covered=[node]), Replacement(reroute=pairs))
            changes.append(([node.name or node.op], [], removed))
        if changes:
            g.commit()
        return changes


def _key(node: gs.Node, inputs: dict[int, tuple]) -> tuple | None:
    """What the node computes, as a hashable key; None for nodes never merged. `inputs`: the
    keys of the tensors seen so far, by identity."""
    if not is_default_domain(node.domain) or node.op in RANDOM_OPS or node.op in QDQ_OPS or not node.outputs:
        return None
    attrs = []
    for name, value in sorted(node.attrs.items()):
        attr = _value_key(value)
        if attr is None:
            return None
        attrs.append((name, attr))
    keys = []
    for tensor in node.inputs:
        key = inputs.get(id(tensor))
        if key is None:
            key = inputs[id(tensor)] = _input_key(tensor)
        keys.append(key)
    return node.op, len(node.outputs), tuple(keys), tuple(attrs)


def _input_key(tensor: gs.Tensor) -> tuple:
    if isinstance(tensor, gs.Variable) and tensor.name == "" and not tensor.inputs:
        return ("missing",)  # an omitted optional input: every such placeholder is the same
    value = _small_constant(tensor)
    return ("value", *value) if value is not None else ("tensor", id(tensor))


def _small_constant(tensor: gs.Tensor) -> tuple | None:
    if isinstance(tensor, gs.Constant):
        if isinstance(tensor.dtype, int) or _nbytes(tensor) > VALUE_KEY_BYTES:
            return None
    value = constant_value(tensor)
    if value is None or value.nbytes > VALUE_KEY_BYTES or value.dtype == object:
        return None
    # the dtype itself, not its name: str(dtype) is a Python function, 30 us a call (36k inputs
    # at 12k nodes)
    return value.dtype, value.shape, value.tobytes()


def _nbytes(tensor: gs.Constant) -> int:
    return math.prod(tensor.shape) * np.dtype(tensor.dtype).itemsize


def _value_key(value: object) -> object:
    """Attributes as hashable values; None for a subgraph, which is never compared."""
    if isinstance(value, gs.Graph):
        return None
    if isinstance(value, gs.Constant):
        return _small_constant(value) or ("tensor", id(value))
    if isinstance(value, (list, tuple)):
        items = [_value_key(v) for v in value]
        return None if any(i is None for i in items) else tuple(items)
    if isinstance(value, np.ndarray):
        return value.dtype, value.shape, value.tobytes()
    return (type(value).__name__, value)
