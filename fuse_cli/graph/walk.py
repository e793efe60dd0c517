"""Every graph of a model: the given graphs (or functions) and the If/Loop/Scan bodies nested in them."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def all_graphs(*bodies) -> Iterator[onnx.GraphProto]:
    """The given graphs (or functions) and every subgraph nested in their nodes, outermost first."""
    for body in bodies:
        yield body
        for node in body.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from all_graphs(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    yield from all_graphs(*attr.graphs)
