"""Keeping a fused output's dims as unnamed to onnxruntime's allocation planner as the subgraph it
replaces left them.

onnxruntime's planner hands a dead buffer to a later tensor of the same planner shape, and with
the memory arena off that buffer stays allocated from its first tenant's birth to its last
tenant's death (analysis/memory.py, "Buffers" and "Lifetimes"): sharing never lowers the peak,
it only lengthens lives. In a TorchScript decoder the attention's mask (or repeat_kv's K/V) is
shaped at run time (Expand to a computed shape), which onnxruntime's inference cannot name: the
scores, the merged heads and every tensor after them are [?, ?, hidden] to the planner, so layer
N+1's MLP never takes layer N's MLP buffers. A fused attention's output is inferred from the
query alone, [batch, sequence, hidden]: the two MLPs then share, and layer N's three MLP buffers
stay allocated across layer N+1's attention. Llama's opset-17 prefill at batch 64 x 64 measured
27.7 MiB unfused, 37.1 with GroupQueryAttention, 26.2 with it behind a Reshape to its own Shape
(a view: no bytes, no copy), which onnxruntime's inference reads no values of, as the original's
runtime-shaped merge was."""

from __future__ import annotations

from collections.abc import Iterable

import onnx_graphsurgeon as gs

from fuse_cli.analysis.planner_shapes import SHAPE_VALUE_INPUT
from fuse_cli.graph.edit import GraphEditor

# How far back from the attention's inputs a runtime shape is looked for (the mask's Expand is a
# few nodes up: Where, Cast, Sub, Expand).
_SEARCH_LIMIT = 64


def shaped_at_run_time(tensors: Iterable[gs.Tensor | None]) -> bool:
    """Some tensor's shape comes, through the ops above it, from a shape vector computed at run
    time (Expand, Reshape, Tile, ... of a non-constant shape): onnxruntime's inference leaves such
    dims unnamed, and so the dims of what is computed from it."""
    todo, seen = [t for t in tensors if t is not None], set()
    while todo and len(seen) < _SEARCH_LIMIT:
        t = todo.pop()
        if id(t) in seen or isinstance(t, gs.Constant) or not t.inputs:
            continue
        seen.add(id(t))
        node = t.inputs[0]
        if node.domain not in (None, "", "ai.onnx") or node.op in ("Shape", "Size", "Constant"):
            continue  # a shape vector's own length is the rank it reads
        index = SHAPE_VALUE_INPUT.get(node.op)
        if index is not None and len(node.inputs) > index and _computed(node.inputs[index]):
            return True
        # the data inputs' dims carry on into the output; a constant shape vector's values do not
        todo += [i for k, i in enumerate(node.inputs) if isinstance(i, gs.Variable) and k != index]
    return False


def unnamed_where_it_was(m_inputs: Iterable[gs.Tensor | None], out: gs.Variable) -> bool:
    """Whether a fused node writing `out` should write it unnamed (unnamed_like_the_original): the
    replaced subgraph read a runtime-shaped input, the model declares no shape for `out` (a
    declared shape is what onnxruntime's inference merges into, and it names the dims anyway), and
    some reader would pass the dims on (GPT-2's Conv1D views the rows as Reshape [-1, hidden], whose
    row count the planner cannot name either: nothing to gain there)."""
    return (out.shape is None and shaped_at_run_time(m_inputs)
            and not all(node.op == "Shape" or _folds_rows(node, out) for node in out.outputs))


def unnamed_like_the_original(y: gs.Variable, out: gs.Variable, g: GraphEditor, base: str) -> list[gs.Node]:
    """out = Reshape(y, Shape(y)): y's values as they are, its dims unnamed to onnxruntime's planner."""
    shape = g.node("Shape", [y], name=f"{base}_shape")
    return [shape, g.node("Reshape", [y, shape.outputs[0]], name=f"{base}_unnamed", outputs=[out])]


def is_unnamed_view(node: gs.Node) -> bool:
    """node is Reshape(x, Shape(x)) (unnamed_like_the_original's view): the passes that fold Reshapes
    and their shapes leave it as it is, a view that costs nothing; folded into a constant shape, or
    into the Reshape after it, it would name the dims again."""
    if node.op != "Reshape" or len(node.inputs) < 2 or not node.inputs[1].inputs:
        return False
    shape = node.inputs[1].inputs[0]
    return (shape.op == "Shape" and shape.inputs[0] is node.inputs[0] and not shape.attrs.get("start")
            and shape.attrs.get("end") is None)


def _folds_rows(node: gs.Node, x: gs.Tensor) -> bool:
    """A Reshape of x (an attention's [B, S, hidden]) to a shape computed at run time, or to a
    constant one of rank 1 or 2 with a -1 (B and S in one, a product onnxruntime does not name)."""
    if node.op != "Reshape" or node.inputs[0] is not x:
        return False
    shape = node.inputs[1]
    if not isinstance(shape, gs.Constant):
        return _computed(shape)
    values = [int(v) for v in shape.values.reshape(-1)]
    return -1 in values and len(values) < 3


def _computed(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Variable) and bool(t.inputs) and t.inputs[0].op != "Constant"
