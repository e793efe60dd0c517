"""Constant folding and dead-node removal, by onnx-graphsurgeon's own folder."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from fuse_cli.errors import FuseError
from fuse_cli.graph.edit import GraphEditor
from fuse_cli.passes.base import GraphPass
from fuse_cli.passes.registry import register

# Their value differs from run to run, so computing it once would change the model's meaning
# (graphsurgeon folds any node whose inputs are all constant, including input-less RandomUniform).
# Dropout is random in training mode; in inference mode eliminate-dropout removes it instead.
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout",
})


@register
class FoldConstants(GraphPass):
    """Evaluate every node whose inputs are all constants (onnxruntime runs them once, now) and
    drop nodes whose outputs nobody reads. Weights built at run time by ConstantOfShape, Constant
    or shape arithmetic become initializers, which the fusions after this pass need.

    Tensors larger than the fold limit (--fold-limit, default 64 MB) stay computed at run time,
    so a ConstantOfShape with a huge shape cannot blow up the file or our memory. Random
    operators are never folded. Subgraphs of If/Loop/Scan are left untouched.
    """

    name = "fold-constants"
    description = "Fold constant subgraphs into initializers and remove dead nodes"
    label = "Constant folding / dead nodes"

    def run(self, g: GraphEditor) -> list[tuple[list[str], list[str], list[str]]]:
        graph = g.graph
        outputs_before = {id(n): (n.name or n.op, n.op, [t.name for t in n.outputs]) for n in graph.nodes}
        try:
            graph.fold_constants(size_threshold=g.fold_limit_bytes, recurse_subgraphs=False, error_ok=True,
                                 should_exclude_node=_is_random)
            graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
        except RecursionError as exc:
            raise FuseError("constant folding: graph too deep for onnx-graphsurgeon's recursive folder") from exc
        remaining = {id(n) for n in graph.nodes}
        now_weights = {name for name, t in graph.tensors().items() if isinstance(t, gs.Constant)}
        changes = []
        for node_id, (name, op, outputs) in outputs_before.items():
            if node_id in remaining:
                continue
            # Only tensors that are gone count as removed: a folded output that became a weight
            # still occupies memory (now resident), so claiming it as saved would flatter us.
            removed = [t for t in outputs if t and t not in now_weights]
            changes.append(([name], [], removed))
        return changes


def _is_random(node: gs.Node) -> bool:
    return node.op in NONDETERMINISTIC_OPS and (node.domain or "") in ("", "ai.onnx")
