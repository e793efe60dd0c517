"""What fold-constants does around graphsurgeon's folder: what a fold would read and make, judged
from shapes and small values before onnxruntime computes anything (--fold-limit: graphsurgeon's
own size_threshold is applied to the computed value, after the memory is spent: a 4 KB model's
ConstantOfShape took 2.2 GB at --fold-limit 1), and the weights it transposes or maps itself."""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from fuse_cli.graph.edit import GraphEditor


def reads_constant_over(node: gs.Node, limit: int) -> bool:
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


def may_make_over(node: gs.Node, g: GraphEditor, limit: int) -> bool:
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


def transpose_weights_in_place(graph: gs.Graph, g: GraphEditor, excluded) -> bool:
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


def map_weights_read_by_foldable_nodes(graph: gs.Graph, excluded) -> None:
    """graphsurgeon hands onnxruntime the constants a folded node reads by value, and onnxruntime
    cannot follow fuse's references to weights (absolute paths): map those weights in (read-only
    views of their files, each under the fold limit, as `excluded` skips nodes reading more);
    fusing.py hands the references back at export. A node whose inputs become constant only when
    the nodes before it fold (a Slice of an LSTM's weight by starts an Unsqueeze/Concat chain
    computes) is folded in the same session: its weights are mapped too, else onnxruntime refuses
    the whole fold ("Absolute path not allowed for external data location")."""
    computed: set[int] = set()  # tensors the fold will compute, by identity
    foldable: list[gs.Node] = []
    remaining = list(graph.nodes)
    while remaining:  # to a fixpoint: graph.nodes need not be in topological order mid-pipeline
        later = []
        for node in remaining:
            inputs = [t for t in node.inputs if not t.is_empty()]
            # the inputs first: `excluded` sizes the node's outputs, and most nodes read a variable
            if not all(isinstance(t, gs.Constant) or id(t) in computed for t in inputs) or excluded(node):
                later.append(node)
                continue
            foldable.append(node)
            computed.update(id(t) for t in node.outputs)
        if len(later) == len(remaining):
            break
        remaining = later
    for node in foldable:
        for tensor in node.inputs:
            if isinstance(tensor, gs.Constant) and isinstance(tensor._values, LazyValues):
                tensor._values = tensor._values.load()
