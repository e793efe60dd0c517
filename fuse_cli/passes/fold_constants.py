"""Constant folding and dead-node removal, by onnx-graphsurgeon's own folder."""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import numpy as np
import onnx_graphsurgeon as gs
import onnxruntime
from onnx_graphsurgeon.ir.tensor import LazyValues

from fuse_cli.core import isolation
from fuse_cli.core.domains import is_default_domain
from fuse_cli.core.model_runs import run_constants
from fuse_cli.errors import FuseError
from fuse_cli.graph.edit import GraphEditor
from fuse_cli.pipeline.base import Decline, GraphPass
from fuse_cli.pipeline.registry import register

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
            return (_is_random(node) or _reads_constant_over(node, g.fold_limit_bytes)
                    or _may_make_over(node, g, g.fold_limit_bytes))

        transposed = _transpose_weights_in_place(graph, g, excluded)
        try:
            folding = _may_fold(graph, excluded)
            if folding:
                _map_weights_read_by_foldable_nodes(graph, excluded)
                # graphsurgeon evaluates with onnxruntime sessions at its default log level, whose
                # optimizer warnings ("UnsqueezeElimination cannot remove node") are noise here
                onnxruntime.set_default_logger_severity(3)
                # an If with a constant condition is inline-constant-if's (see there)
                with _sessions_in_the_worker() as crashes:
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


class _WorkerSession:
    """What graphsurgeon's folder needs of an InferenceSession (`run(names, {})` on an input-free
    model), run in a worker process: a runtime that crashes on a constant subgraph is a subgraph
    left unfolded (graphsurgeon's error_ok), not fuse's death."""

    def __init__(self, model_bytes: bytes, crashes: list[str]):
        self.model_bytes, self.crashes = model_bytes, crashes

    def run(self, names, feeds):
        if feeds:  # graphsurgeon's folder feeds nothing; anything else is not ours to route
            raise FuseError("a folding session was given inputs")
        try:
            return isolation.call_aside(run_constants, self.model_bytes, names)
        except isolation.RuntimeCrash as crash:
            self.crashes.append(crash.how)
            raise


@contextlib.contextmanager
def _sessions_in_the_worker():
    """graphsurgeon imports onnxruntime inside its folder and builds sessions there: for the length
    of the fold, sessions this thread builds go to the worker; other threads (verification's
    reference runs, beside the pipeline) keep onnxruntime's own class. Yields the crashes seen."""
    real, folding, crashes = onnxruntime.InferenceSession, threading.get_ident(), []

    def session(model, *args, **kwargs):
        if threading.get_ident() == folding and isinstance(model, bytes):
            return _WorkerSession(model, crashes)
        return real(model, *args, **kwargs)

    onnxruntime.InferenceSession = session
    try:
        yield crashes
    finally:
        onnxruntime.InferenceSession = real


def _has_dead_end(graph: gs.Graph) -> bool:
    """Is some node's every output unread (and none a graph output)? Every dead chain ends in
    such a node; a tensor read only inside a subgraph looks unread here, which only means a
    cleanup that finds nothing."""
    outputs = {id(t) for t in graph.outputs}
    return any(all(not t.outputs and id(t) not in outputs for t in node.outputs) for node in graph.nodes)


def _transpose_weights_in_place(graph: gs.Graph, g: GraphEditor, excluded) -> bool:
    """Transpose(weight) becomes the transposed weight, by numpy, before graphsurgeon's folder.

    torch.onnx.export with do_constant_folding=False writes every Linear as MatMul(x,
    Transpose(W)). graphsurgeon would fold those too, but through a copy of the graph exported
    with every weight involved and an onnxruntime session holding them again: on BERT-base
    (324 MB of such weights) that raised fuse's peak RSS by 1.1 GB. Here each costs one array.
    Returns whether it transposed any."""
    transposed = False
    for node in graph.nodes:
        if node.op != "Transpose" or len(node.inputs) != 1 or len(node.outputs) != 1 or excluded(node):
            continue
        weight, out = node.inputs[0], node.outputs[0]
        if (not isinstance(weight, gs.Constant) or isinstance(weight.dtype, int) or weight.name in g.input_defaults
                or g.is_graph_output(out)):
            continue  # an onnx-only dtype numpy lacks, or a weight the user may replace at run time
        perm = node.attrs.get("perm", list(range(len(weight.shape)))[::-1])
        # LazyValues.load, not .values: that would cache the untransposed copy on the dead weight
        lazy = weight._values if isinstance(weight._values, LazyValues) else None
        values = np.ascontiguousarray(np.transpose(lazy.load() if lazy else weight.values, perm))
        out.to_constant(g.hold(out.name, values))
        node.outputs.clear()  # the node and, unless read elsewhere, the weight are now dead
        transposed = True
    return transposed


def _map_weights_read_by_foldable_nodes(graph: gs.Graph, excluded) -> None:
    """graphsurgeon hands onnxruntime the constants a folded node reads by value, and onnxruntime
    cannot follow fuse's references to weights (absolute paths): map those weights in (read-only
    views of their files, each under the fold limit, as `excluded` skips nodes reading more);
    fusing.py hands the references back at export."""
    for node in graph.nodes:
        inputs = [t for t in node.inputs if not t.is_empty()]
        if not excluded(node) and all(isinstance(t, gs.Constant) for t in inputs):
            for tensor in inputs:
                if isinstance(tensor._values, LazyValues):
                    tensor._values = tensor._values.load()


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


def _reads_constant_over(node: gs.Node, limit: int) -> bool:
    """Sized from shape and dtype, never by loading the values."""
    for tensor in node.inputs:
        if isinstance(tensor, gs.Constant):
            itemsize = np.dtype(tensor.dtype).itemsize if not isinstance(tensor.dtype, int) else 1
            if math.prod(tensor.shape) * itemsize > limit:
                return True
    return False


# Outputs sized by an input's value; their size is computed from that value (small: a shape).
_SIZED_BY_VALUE = {"ConstantOfShape", "Expand", "Tile", "Range", "Pad", "OneHot", "Resize", "Upsample"}
_SMALL = 1024


def _may_make_over(node: gs.Node, g: GraphEditor, limit: int) -> bool:
    """Would folding `node` make a tensor over the limit? Judged from shapes before onnxruntime
    computes anything (graphsurgeon's size_threshold is applied to the computed value: a 4 KB
    model's ConstantOfShape took 2.2 GB at --fold-limit 1). Unknown counts as over."""
    size = _output_bytes(node, g)
    return size is None or size > limit


def _output_bytes(node: gs.Node, g: GraphEditor) -> int | None:
    shapes = [g.shape(t) for t in node.outputs]
    if all(s is not None and None not in s.dims and all(isinstance(d, int) for d in s.dims) for s in shapes):
        return sum(math.prod(s.dims) * (g.dtype(t).itemsize if g.dtype(t) is not None else 8)
                   for s, t in zip(shapes, node.outputs))
    inputs = [t for t in node.inputs if not t.is_empty()]
    if not all(isinstance(t, gs.Constant) for t in inputs):
        return 0  # not folded by this pass: graphsurgeon folds only all-constant nodes
    try:
        if node.op in _SIZED_BY_VALUE:
            if not all(math.prod(t.shape) <= _SMALL for t in inputs[1:] if node.op != "ConstantOfShape"):
                return None
            count = _count_sized_by_value(node, inputs)
        else:
            # elementwise and broadcasting operators: no bigger than their inputs broadcast
            count = math.prod(np.broadcast_shapes(*(tuple(t.shape) for t in inputs))) if inputs else 1
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    return None if count is None else count * _itemsize(node, inputs)


def _itemsize(node: gs.Node, inputs: list[gs.Constant]) -> int:
    """The output's element size: the widest input's (a Cast: at most 8; onnx-only types: 2)."""
    if node.op == "Cast" or (node.op == "ConstantOfShape" and "value" in node.attrs):
        return 8
    sizes = [np.dtype(t.dtype).itemsize if not isinstance(t.dtype, int) else 2 for t in inputs]
    return max(sizes, default=4) if node.op != "ConstantOfShape" else 4


def _count_sized_by_value(node: gs.Node, inputs: list[gs.Constant]) -> int | None:
    values = [np.asarray(t.values).reshape(-1) if math.prod(t.shape) <= _SMALL else None for t in inputs]
    if node.op == "ConstantOfShape":
        return math.prod(abs(int(v)) for v in values[0]) if values[0] is not None else None
    if node.op == "Range":
        start, limit, delta = (float(v[0]) for v in values[:3])
        return max(math.ceil((limit - start) / delta), 0) if delta and math.isfinite(limit - start) else None
    shape = [int(d) for d in inputs[0].shape]
    if node.op == "Expand":
        return math.prod(np.broadcast_shapes(tuple(shape), tuple(abs(int(v)) for v in values[1])))
    if node.op == "Tile":
        return math.prod(shape) * math.prod(abs(int(v)) for v in values[1])
    if node.op == "Pad" and len(values[1]) == 2 * len(shape):
        return math.prod(d + abs(int(a)) + abs(int(b)) for d, a, b in zip(shape, values[1][:len(shape)],
                                                                         values[1][len(shape):]))
    return None  # Resize, Upsample, OneHot, a Pad of the old form: sized by more than one value


def _is_random(node: gs.Node) -> bool:
    """Not foldable: random ops (their value changes per run), quantization boundaries, and
    producers of sequences and optionals."""
    return node.op in NONDETERMINISTIC_OPS | QUANTIZATION_OPS | NON_TENSOR_OPS and is_default_domain(node.domain)
