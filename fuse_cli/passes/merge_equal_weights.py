"""Equal weights become one initializer: the readers of a copy read the first of them."""

from __future__ import annotations

from collections import defaultdict

import onnx_graphsurgeon as gs

from fuse_cli.graph.edit import GraphEditor
from fuse_cli.graph.weights import WeightBytes
from fuse_cli.pipeline.base import GraphPass
from fuse_cli.pipeline.registry import register


@register
class MergeEqualWeights(GraphPass):
    """Initializers of the same dtype, shape and bytes are one weight:

        Conv(x, W1) ...  Conv(y, W2)       with W1 == W2        Conv(x, W1) ...  Conv(y, W1)

    Exact: the readers see the same values. What it saves is weight memory and bandwidth, not
    activations: the session holds one copy, its cache one line, and nodes that now read the
    same weight are plain common subexpressions (eliminate-common-subexpressions merges them).
    Equal copies come from exporters that write one tensor per use (shared scales, a tied
    weight saved twice), from constant folding, and from untrained models (every LayerNorm's
    ones and zeros).

    Compared by bit pattern, so 0.0 and -0.0 (or two NaN payloads) stay apart. Weights of one
    dtype and shape are first compared on a sample (both ends and the middle), so a big model's
    distinct weights are never read whole; only equal samples are compared in full, in pieces,
    and weights held in files are read from them, not mapped (graph/weights.WeightBytes).

    Left alone: graph inputs with defaults (callers may feed them; --freeze-inputs makes them
    constants), constants that are graph outputs, and constants read inside If/Loop/Scan bodies.
    The report counts each merge, with no node or activation removed; the weight bytes saved
    show in its weights line.
    """

    name = "merge-equal-weights"
    description = "Make initializers of equal dtype, shape and values one initializer"
    label = "Equal weights merged"

    def run(self, g: GraphEditor) -> list[tuple[list[str], list[str], list[str]]]:
        readers = _readers_by_weight(g)
        changes = []
        for group in _same_dtype_and_shape(readers):
            for kept, copies in _equal_values(group):
                for copy in copies:
                    for node, index in readers[id(copy)][1]:
                        node.inputs[index] = kept
                    changes.append(([], [], []))  # no node replaced, no activation removed: weight bytes only
        return changes


def _readers_by_weight(g: GraphEditor) -> dict[int, tuple[gs.Constant, list[tuple[gs.Node, int]]]]:
    """Each weight the main graph's nodes read, in the order first read, with its (node, input
    index) readers; weights that are graph outputs or read inside a subgraph are left out."""
    weights: dict[int, tuple[gs.Constant, list[tuple[gs.Node, int]]]] = {}
    for node in g.graph.nodes:
        for index, tensor in enumerate(node.inputs):
            if isinstance(tensor, gs.Constant):
                weights.setdefault(id(tensor), (tensor, []))[1].append((node, index))
    for tensor_id in _read_in_subgraphs(g.graph) | {id(t) for t in g.graph.outputs}:
        weights.pop(tensor_id, None)
    return weights


def _read_in_subgraphs(graph: gs.Graph) -> set[int]:
    found: set[int] = set()
    for node in graph.nodes:
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, gs.Graph):
                    found.update(id(t) for inner in sub.nodes for t in inner.inputs if isinstance(t, gs.Constant))
                    found |= _read_in_subgraphs(sub)
    return found


def _same_dtype_and_shape(weights: dict) -> list[list[gs.Constant]]:
    """Groups of two or more weights that may be equal, known without reading any values."""
    groups: dict[tuple, list[gs.Constant]] = defaultdict(list)
    for tensor, _ in weights.values():
        groups[(str(tensor.dtype), tuple(tensor.shape))].append(tensor)
    return [group for group in groups.values() if len(group) > 1]


def _equal_values(group: list[gs.Constant]) -> list[tuple[gs.Constant, list[gs.Constant]]]:
    """(the first weight, its later equal copies) for each value held more than once."""
    by_sample: dict[bytes, list[WeightBytes]] = defaultdict(list)
    for tensor in group:
        data = WeightBytes.of(tensor)
        if data is not None:
            by_sample[data.sample()].append(data)
    merged = []
    for candidates in by_sample.values():
        if len(candidates) < 2:
            continue
        by_digest: dict[bytes, list[WeightBytes]] = defaultdict(list)
        for data in candidates:
            by_digest[data.digest()].append(data)
        for kept, *copies in by_digest.values():
            equal = [c.tensor for c in copies if c.equals(kept)]
            if equal:
                merged.append((kept.tensor, equal))
    return merged
