"""Constant folding and dead-node removal, by onnx-graphsurgeon's own folder."""

from __future__ import annotations

import functools

import numpy as np
import onnx

import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from fuse_cli.analysis.inserted_casts import CAST_PREFIX
from fuse_cli.core.domains import is_default_domain
from fuse_cli.core.folding_sessions import sessions_in_the_worker
from fuse_cli.errors import FuseError
from fuse_cli.graph.edit import GraphEditor
from fuse_cli.pipeline.base import Decline, GraphPass
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.folding import (map_weights_read_by_foldable_nodes, may_make_over, reads_constant_over,
                                     transpose_weights_in_place)

# Their value differs from run to run, so computing it once would change the model's meaning
# (graphsurgeon folds any node whose inputs are all constant, including input-less RandomUniform).
# Dropout is random in training mode; in inference mode eliminate-dropout removes it instead.
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout",
})
# Folding DequantizeLinear(int8 weight) would be exact in float, but it turns a quantized (QDQ)
# model into a float one: the runtime would no longer run that layer in int8. Keep Q/DQ nodes.
QUANTIZATION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Their outputs are sequences or optionals, which an initializer cannot hold (graphsurgeon's folder
# crashes on the list onnxruntime returns for SequenceEmpty, which has no inputs at all).
NON_TENSOR_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase",
                            "SplitToSequence", "Optional"})


@register
class FoldConstants(GraphPass):
    """Evaluate every node whose inputs are all constants (onnxruntime runs them once, now) and
    drop nodes whose outputs nobody reads. Weights built at run time by ConstantOfShape, Constant
    or shape arithmetic become initializers, which the fusions after this pass need.

    Folded values that come out equal (two branches built from identical ConstantOfShape or
    Constant weights) are made one weight by merge-equal-weights, so that
    eliminate-common-subexpressions merges the branches: onnxruntime's own common-subexpression
    elimination merges them in the original, before it folds those builders itself.

    Tensors larger than the fold limit (--fold-limit, default 64 MB) stay computed at run time,
    so a ConstantOfShape with a huge shape cannot blow up the file or our memory; nor is a node
    that reads a constant over the limit folded (onnxruntime would be handed a copy of the whole
    weight, e.g. a 1 GB Transpose, only for the result to be discarded as too big). Random
    operators are never folded. Subgraphs of If/Loop/Scan are left untouched. onnxruntime runs
    the constant subgraphs in a worker process (core/isolation.py): where it crashes on one, the
    fold is tried again a part at a time, and what crashes stays computed at run time.

    graphsurgeon's folder copies the whole graph before it looks for anything to fold (seconds
    on a 10k-node graph), so a scan for what it could fold comes first: Constant nodes (lowered),
    Shape nodes (folded from static shapes), Casts (its shape-tensor cast elision), If nodes
    (flattened on a constant condition), model-local functions (folded inside), and nodes whose
    inputs are all constants. With none of these the folder would change nothing: only the
    dead-node removal runs.
    """

    name = "fold-constants"
    description = "Fold constant subgraphs into initializers and remove dead nodes"
    label = "Constant folding / dead nodes"

    def run(self, g: GraphEditor) -> list[tuple[list[Decline], list[Decline], list[Decline]]]:
        graph = g.graph
        outputs_before = {id(n): (n.name or n.op, n.op, [t.name for t in n.outputs]) for n in graph.nodes}

        def excluded(node: gs.Node) -> bool:
            return (_is_random(node) or reads_constant_over(node, g.fold_limit_bytes)
                    or may_make_over(node, g, g.fold_limit_bytes) or _placed_cast_of_a_weight(node, g))

        transposed = transpose_weights_in_place(graph, g, excluded)
        try:
            folding = _may_fold(graph, excluded)
            if folding:
                map_weights_read_by_foldable_nodes(graph, excluded)
                # an If with a constant condition is inline-constant-if's (see there)
                # its warnings (a subgraph it could not fold) are not the user's to read on stderr
                with sessions_in_the_worker() as crashes, G_LOGGER.suppress(G_LOGGER.ERROR):
                    fold = functools.partial(graph.fold_constants, size_threshold=g.fold_limit_bytes,
                                             recurse_subgraphs=False, error_ok=True, should_exclude_node=excluded,
                                             flatten_subgraphs=False)
                    fold()
                    if crashes:  # the whole constant subgraph in one session crashed: a part at a time
                        fold(partitioning="recursive")
            # graphsurgeon's cleanup walks every node and tensor: only when something may be dead
            # (a confirming round on a deep model has nothing to fold: 0.1 s at 12k nodes)
            if folding or transposed or _has_dead_end(graph):
                graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
        except RecursionError as exc:
            raise FuseError("constant folding: graph too deep for onnx-graphsurgeon's recursive folder") from exc
        remaining = {id(n) for n in graph.nodes}
        if all(node_id in remaining for node_id in outputs_before):
            return []  # the scan of every tensor below is for removed nodes only
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


def _placed_cast_of_a_weight(node: gs.Node, g: GraphEditor) -> bool:
    """A Cast of a float weight to a wider float that onnxruntime's CPU provider placed, or
    write-cpu-casts wrote as it does (named CAST_PREFIX..., the runtime's own mark for the Casts it
    inserts and may cancel): stored before the layers, it runs right before its reader. Folded,
    the weight would be stored, and held resident, at twice its size for good (a second run of fuse
    doubled a float16 model's weights). Any other Cast of a weight folds, so the fusions that need
    a constant weight (conv-bn, matmul-add) still see one."""
    if node.op != "Cast" or not node.name.startswith(CAST_PREFIX) or not node.inputs:
        return False
    if not isinstance(node.inputs[0], gs.Constant) or node.attrs.get("to") is None:
        return False
    source = g.dtype(node.inputs[0])
    target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"])))
    return source is not None and source.kind == target.kind == "f" and target.itemsize > source.itemsize


def _has_dead_end(graph: gs.Graph) -> bool:
    """Is some node's every output unread (and none a graph output)? Every dead chain ends in
    such a node; a tensor read only inside a subgraph looks unread here, which only means a
    cleanup that finds nothing."""
    outputs = {id(t) for t in graph.outputs}
    return any(all(not t.outputs and id(t) not in outputs for t in node.outputs) for node in graph.nodes)


# What graphsurgeon's folder acts on besides nodes with all-constant inputs (see the class doc).
_FOLDER_OPS = frozenset({"Constant", "Shape", "Cast", "If"})


def _may_fold(graph: gs.Graph, excluded) -> bool:
    if graph.functions:
        return True
    for node in graph.nodes:
        if node.op in _FOLDER_OPS:
            return True
        if all(isinstance(t, gs.Constant) for t in node.inputs if not t.is_empty()) and not excluded(node):
            return True
    return False


def _is_random(node: gs.Node) -> bool:
    """Not foldable: random ops (their value changes per run), quantization boundaries, and
    producers of sequences and optionals."""
    return node.op in NONDETERMINISTIC_OPS | QUANTIZATION_OPS | NON_TENSOR_OPS and is_default_domain(node.domain)
