"""Constant folding and dead-node removal, by onnx-graphsurgeon's own folder."""

from __future__ import annotations

from fuse_cli.errors import FuseError
from fuse_cli.graph.edit import GraphEditor
from fuse_cli.passes.base import GraphPass
from fuse_cli.passes.registry import register


@register
class FoldConstants(GraphPass):
    """Evaluate every node whose inputs are all constants (onnxruntime runs them once, now) and
    drop nodes whose outputs nobody reads. Weights built at run time by ConstantOfShape, Constant
    or shape arithmetic become initializers, which the fusions after this pass need.

    Tensors larger than the fold limit (--fold-limit, default 64 MB) stay computed at run time,
    so a ConstantOfShape with a huge shape cannot blow up the file or our memory. Subgraphs of
    If/Loop/Scan are left untouched.
    """

    name = "fold-constants"
    description = "Fold constant subgraphs into initializers and remove dead nodes"
    label = "Constant folding / dead nodes"

    def run(self, g: GraphEditor) -> list[tuple[list[str], list[str], list[str]]]:
        graph = g.graph
        outputs_before = {id(n): (n.name or n.op, n.op, [t.name for t in n.outputs]) for n in graph.nodes}
        try:
            graph.fold_constants(size_threshold=g.fold_limit_bytes, recurse_subgraphs=False, error_ok=True)
            graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
        except RecursionError as exc:
            raise FuseError("constant folding: graph too deep for onnx-graphsurgeon's recursive folder") from exc
        remaining = {id(n) for n in graph.nodes}
        changes = []
        for node_id, (name, op, outputs) in outputs_before.items():
            if node_id in remaining:
                continue
            # A folded node's outputs were activations written at run time; now they are weights
            # or gone. A Constant node's output always was a weight: no activation disappears.
            removed = [] if op == "Constant" else [t for t in outputs if t]
            changes.append(([name], [], removed))
        return changes
